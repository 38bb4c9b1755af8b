"""The training step as a process of its own: the step spec, the child's side, the parent's side.

``training.launcher`` picks where a cycle's step runs. ``inprocess`` calls
``train_adapter`` in a thread of the loop. ``subprocess`` and ``accelerate``
write a ``TrainingStepSpec`` (everything the step needs, the data already built
by the loop) to a JSON file and start ``python -m coevolve.training SPEC.json``,
once or through ``accelerate launch`` on N processes. The child trains with
``train_adapter`` (which saves the adapter atomically, on the main process only)
and the main process writes the ``TrainResult`` to ``spec.result_file``, also
when the step was skipped. The parent streams the child's output into the run's
log file, shows one spinner, and on a failure raises ``LaunchError`` naming the
log file and quoting its last lines.

Why not ``accelerate launch`` of the whole loop: it would start N copies of
rollouts, synthesis and evaluation. Only the training step is launched.

On a CPU, accelerate's ``MULTI_CPU`` launcher starts one process unless it is
given an MPI hostfile; ``configs/accelerate/ddp-cpu.yaml`` therefore asks for
``MULTI_GPU`` (accelerate's torchrun launcher), and the children, told
``use_cpu`` by the training arguments, join a gloo process group.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ..agents.prompts import POLICY_SYSTEM_PROMPT
from ..outputs.tracking import TrainTracking
from ..records import Task
from .adapters import TrainResult
from .config import TrainingConfig
from .datasets import PreferencePair, TrainingConversation

if TYPE_CHECKING:  # pragma: no cover
    from ..envs.base import Environment

logger = logging.getLogger(__name__)

# The accelerate configs shipped with coevolve, by name (``accelerate_config: ddp``).
ACCELERATE_CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "accelerate"
# Lines of the child's output quoted in an error.
TAIL_LINES = 30


class LaunchError(RuntimeError):
    """A launched training step that failed; the message names the log file and quotes it."""


class TrainingStepSpec(BaseModel):
    """Everything one training step needs, as a JSON file for a launched process."""

    model_config = ConfigDict(extra="forbid")

    config: TrainingConfig = Field(description="The training config of the step.")
    model_dir: str = Field(description="The base model directory.")
    output_dir: str = Field(description="Where the adapter goes (written atomically).")
    previous_adapter: str | None = Field(
        default=None, description="The adapter to continue; None starts a new one."
    )
    conversations: list[list[dict[str, Any]] | TrainingConversation] = Field(
        default_factory=list,
        description="sft: the conversations, already built: messages, or messages with the "
        "tools of their prompt and the rollout's token ids.",
    )
    example_weights: list[float] | None = Field(
        default=None, description="sft: one loss weight per conversation (SEAL); None unweighted."
    )
    pairs: list[PreferencePair] = Field(default_factory=list, description="dpo: the pairs.")
    tasks: list[Task] = Field(default_factory=list, description="grpo: the tasks to roll out.")
    environment: str | None = Field(
        default=None,
        description="grpo: the environment's registry name (envs/registry.py); the child "
        "rebuilds make_env from it, since a factory cannot be written to a file.",
    )
    system_prompt: str | None = Field(
        default=POLICY_SYSTEM_PROMPT, description="grpo: the system prompt of the rollouts."
    )
    tools_in_prompt: bool = Field(
        default=False, description="grpo: the prompts carry the tool schemas, as the policy's do."
    )
    tracking: TrainTracking | None = Field(
        default=None, description="Where the trainer reports (the run's trackers)."
    )
    capability_state_path: str | None = Field(
        default=None, description="SEAL reweighting: the capability state file."
    )
    seed: int | None = Field(
        default=None,
        description="Seed of Python, NumPy and torch before the trainer is built (the loop's "
        "seed_everything of the step), so a launched step starts as an in-process one.",
    )
    result_file: str = Field(
        description="Where the main process writes the TrainResult (also when skipped)."
    )

    def make_env(self) -> Callable[[], Environment] | None:
        """The environment factory named by ``environment`` (None without one)."""
        if self.environment is None:
            return None
        from ..envs.registry import get_environment

        return get_environment(self.environment).environment


# --------------------------------------------------------------------------- child


def run_spec(spec: TrainingStepSpec) -> TrainResult:
    """Run the step (in the launched process): train, save, write the result on rank 0."""
    from ..common.files import write_atomically
    from .trainer_common import seed_all
    from .trainers import train_adapter

    if spec.seed is not None:
        seed_all(spec.seed)
    if spec.tracking is not None:  # log into the loop's W&B / MLflow runs, not new ones
        os.environ.update(spec.tracking.environment())
    result = train_adapter(
        spec.config,
        model_dir=spec.model_dir,
        output_dir=spec.output_dir,
        previous_adapter=spec.previous_adapter,
        conversations=spec.conversations,
        pairs=spec.pairs,
        tasks=spec.tasks,
        make_env=spec.make_env(),
        system_prompt=spec.system_prompt,
        progress=False,  # the parent draws the one spinner; here stdout is the log file
        tracking=spec.tracking,
        capability_state_path=spec.capability_state_path,
        example_weights=spec.example_weights,
        tools_in_prompt=spec.tools_in_prompt,
    )
    if int(os.environ.get("RANK", "0")) == 0:
        write_atomically(Path(spec.result_file), result.model_dump_json(indent=2))
    return result


# --------------------------------------------------------------------------- parent


def launch_train_adapter(
    config: TrainingConfig,
    *,
    step_file: str | Path,
    log_file: str | Path,
    environment: str | None = None,
    make_env: Callable[[], Environment] | None = None,
    seed: int | None = None,
    progress: bool = True,
    model_dir: str | Path,
    output_dir: str | Path,
    previous_adapter: str | Path | None = None,
    conversations: Sequence[list[dict[str, Any]] | TrainingConversation] = (),
    pairs: Sequence[PreferencePair] = (),
    tasks: Sequence[Task] = (),
    system_prompt: str | None = POLICY_SYSTEM_PROMPT,
    tracking: TrainTracking | None = None,
    capability_state_path: str | Path | None = None,
    example_weights: Sequence[float] | None = None,
    tools_in_prompt: bool = False,
) -> TrainResult:
    """``train_adapter`` in a launched process (``config.launcher``): same arguments and result.

    ``step_file`` is where the spec is written (the result goes beside it);
    ``log_file`` receives the child's output. GRPO's environment travels by
    name (``environment``); ``make_env``, when given, must be that
    environment's registered factory, since the child can only rebuild that.
    """
    if config.algorithm == "grpo" and tasks:
        _check_environment(environment, make_env)
    step = Path(step_file)
    spec = TrainingStepSpec(
        config=config,
        model_dir=str(model_dir),
        output_dir=str(output_dir),
        previous_adapter=str(previous_adapter) if previous_adapter is not None else None,
        conversations=list(conversations),
        example_weights=list(example_weights) if example_weights is not None else None,
        pairs=list(pairs),
        tasks=list(tasks),
        environment=environment if config.algorithm == "grpo" else None,
        system_prompt=system_prompt,
        tools_in_prompt=tools_in_prompt,
        tracking=tracking,
        capability_state_path=str(capability_state_path) if capability_state_path else None,
        seed=seed,
        result_file=str(step.with_suffix(".result.json")),
    )
    return launch_spec(spec, step, log_file, progress=progress)


def _check_environment(environment: str | None, make_env: Callable[[], Environment] | None) -> None:
    from ..envs.registry import get_environment

    if environment is None:
        raise ValueError("a launched GRPO step needs the environment's registry name")
    registered = get_environment(environment).environment
    if make_env is not None and make_env is not registered:
        raise ValueError(
            f"a launched GRPO step rebuilds the environment from its name ({environment!r}), "
            f"but the loop uses another factory ({make_env!r}); use launcher: inprocess"
        )


def launch_spec(
    spec: TrainingStepSpec, step_file: str | Path, log_file: str | Path, progress: bool = True
) -> TrainResult:
    """Write ``spec`` to ``step_file``, run it as ``spec.config.launcher`` says, return its result."""
    from ..common.files import write_atomically

    step = Path(step_file)
    step.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(step, spec.model_dump_json())
    result_file = Path(spec.result_file)
    result_file.unlink(missing_ok=True)  # a stale result of a killed attempt
    command = launch_command(spec.config, step)
    log = Path(log_file)
    logger.info("training step launched (%s): %s", spec.config.launcher, " ".join(command))
    label = f"training ({spec.config.launcher})"
    run_child(command, log, label, spec.config.max_steps if progress else None)
    if not result_file.exists():
        raise LaunchError(
            f"the training step exited cleanly but wrote no result ({result_file}); "
            f"its output is in {log}"
        )
    result = TrainResult.model_validate_json(result_file.read_text())
    expected = spec.config.num_processes
    if expected is not None and result.skipped is None and result.world_size != expected:
        raise LaunchError(
            f"the training step ran on {result.world_size} process(es), not num_processes="
            f"{expected}; check the accelerate config ({spec.config.accelerate_config})"
        )
    return result


def launch_command(config: TrainingConfig, step_file: Path) -> list[str]:
    """The command that runs the step in ``step_file`` the way ``config.launcher`` says."""
    module = [sys.executable, "-m", "coevolve.training", str(step_file)]
    if config.launcher == "subprocess":
        return module
    if config.launcher != "accelerate":
        raise ValueError(f"launcher {config.launcher!r} runs in the loop process, not launched")
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise LaunchError(
            "launcher 'accelerate' needs the accelerate package: pip install accelerate"
        )
    accelerate_file = resolve_accelerate_config(config.accelerate_config, config.num_processes)
    command = [sys.executable, "-m", "accelerate.commands.launch"]
    command += ["--config_file", str(accelerate_file)]
    if config.num_processes is not None:
        command += ["--num_processes", str(config.num_processes)]
    return [*command, "-m", "coevolve.training", str(step_file)]


def resolve_accelerate_config(name_or_path: str | None, num_processes: int | None = None) -> Path:
    """An accelerate config file: a path, or the name of one in configs/accelerate.

    Refuses a ``MULTI_CPU`` config without an MPI hostfile: accelerate would start
    one process where the config asks for several.
    """
    import yaml

    shipped = sorted(path.stem for path in ACCELERATE_CONFIGS.glob("*.yaml"))
    if name_or_path is None:
        raise LaunchError(f"launcher 'accelerate' needs accelerate_config; shipped: {shipped}")
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        path = ACCELERATE_CONFIGS / (name_or_path.removesuffix(".yaml") + ".yaml")
    if not path.is_file():
        raise LaunchError(
            f"accelerate config {name_or_path!r} not found: give a YAML path or one of the "
            f"shipped configs ({', '.join(shipped)}); `accelerate config` writes a new one"
        )
    settings = yaml.safe_load(path.read_text()) or {}
    processes = num_processes or int(settings.get("num_processes") or 1)
    hostfile = (settings.get("mpirun_config") or {}).get("mpirun_hostfile")
    if settings.get("distributed_type") == "MULTI_CPU" and not hostfile and processes > 1:
        raise LaunchError(
            f"{path}: distributed_type MULTI_CPU starts one process unless accelerate is "
            "given an MPI hostfile; for DDP on CPUs use distributed_type MULTI_GPU with "
            f"training.device cpu, as {ACCELERATE_CONFIGS / 'ddp-cpu.yaml'} does"
        )
    return path


def child_environment() -> dict[str, str]:
    """The child's environment: this process's, with the coevolve this process imported
    first on the path (a checkout not installed in the venv runs as itself)."""
    # The directory that holds the package (this file is <package>/training/launch.py).
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(part for part in (root, env.get("PYTHONPATH", "")) if part)
    env["PYTHONUNBUFFERED"] = "1"  # lines reach the log as they happen
    return env


# The trainer's per-step log line (training.trainer_common's logger), one per step.
_STEP_LINE = re.compile(r"coevolve\.trainer INFO: .*step \d+: \{.*'loss':")


def run_child(command: list[str], log_file: Path, label: str, steps: int | None) -> None:
    """Run ``command``, its output appended to ``log_file``; raise ``LaunchError`` on failure.

    With ``steps``, one bar (``label``, steps counted from the trainer's log
    lines) is drawn while it runs; the output itself never reaches the terminal.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    bar = _Bar(label, steps) if steps is not None else None
    # Its own session: a stop of the loop ends the launcher and the ranks it started.
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=child_environment(),
        start_new_session=True,
        text=True,
        errors="replace",
    )

    def copy_output() -> None:
        assert child.stdout is not None
        with log_file.open("a", encoding="utf-8") as log:
            for line in child.stdout:
                log.write(line)
                log.flush()
                tail.append(line.rstrip("\n"))
                if bar is not None and _STEP_LINE.search(line):
                    bar.advance()

    reader = threading.Thread(target=copy_output, daemon=True)
    reader.start()
    try:
        code = child.wait()
    except BaseException:  # interrupted: take the whole process group down with us
        _stop(child)
        raise
    finally:
        reader.join(timeout=10)
        if bar is not None:
            bar.stop()
    if code != 0:
        if code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
            if -code == signal.SIGKILL:
                how += " (out of memory?)"
        else:
            how = f"exited with status {code}"
        last = "\n".join(f"  {line}" for line in tail)
        raise LaunchError(
            f"the training step {how}: {' '.join(command)}\n"
            f"its output is in {log_file}; the last lines:\n{last}"
        )


def _stop(child: subprocess.Popen[str]) -> None:
    try:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class _Bar:
    """One transient rich bar for the launched step: label, steps done, time."""

    def __init__(self, label: str, total: int):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            SpinnerColumn(),
            TextColumn(label),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=True,
        )
        self.task = self.progress.add_task(label, total=total)
        self.progress.start()

    def advance(self) -> None:
        self.progress.advance(self.task)

    def stop(self) -> None:
        self.progress.stop()
