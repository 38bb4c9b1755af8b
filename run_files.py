"""The bottom floor of a run on disk: every file name of a run directory and of its
cycles, with their typed readers and writers. No other module spells one of these names
(tests/test_run_files.py greps the package for them).

A run directory, ``RunFiles(run_dir)``:

    config.yaml               the config the run uses (a resume reads it back)
    checkpoints.sqlite        LangGraph checkpoints (thread "run")
    run.lock                  while a run works here: its pid and host (loop/run_lock.py)
    run.log                   the trainers' log dicts and the roles' log lines (outputs/run_log.py)
    history.jsonl             scores per task and cycle (forgetting)
    patterns.json             action-pattern counts (rare)
    task_store/               the Chroma task store (dedup, nearest tasks)
    synthesized_tasks.jsonl   accepted synthesized tasks with provenance (the pool's file)
    capability_state.json     SEAL's capability state, carried from one GRPO cycle to the next
    tracker_runs.json         the run's MLflow run, so a resumed run logs into it
    tensorboard/              TensorBoard event files (tracking.report_to: [tensorboard])
    adapters/cycle-N/         the LoRA adapter trained in cycle N
    adapters/failure-cycle-N/ hard negatives: the failure agent's adapter after cycle N
    cycles/NNN/               one cycle's files (``CycleFiles``)
    metrics.jsonl             one row per cycle (outputs/report.py)
    summary.json              the cycles' summaries and the pool's counts
    report.png                the run's figures

The learning bench shares one agent's cycle-0 evaluation between runs in a folder of
its own (``SharedBaselineFiles``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, JsonValue

from .common.files import dump_jsonl, load_jsonl, read_jsonl, write_atomically
from .records import FlaggedTrajectory, HardNegativeFigures, Task, Trajectory

Record = TypeVar("Record", bound=BaseModel)

CONFIG_FILE = "config.yaml"
CHECKPOINTS = "checkpoints.sqlite"
LOCK_FILE = "run.lock"
LOG_FILE = "run.log"
HISTORY_FILE = "history.jsonl"
PATTERNS_FILE = "patterns.json"
TASK_STORE_FOLDER = "task_store"
SYNTHESIZED_TASKS_FILE = "synthesized_tasks.jsonl"
CAPABILITY_STATE_FILE = "capability_state.json"
TRACKER_RUNS_FILE = "tracker_runs.json"
TENSORBOARD_FOLDER = "tensorboard"
ADAPTERS_FOLDER = "adapters"
CYCLES_FOLDER = "cycles"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.png"

ROLLOUTS_FILE = "rollouts.jsonl"
UNREACHABLE_PREFIX = "unreachable-"
FLAGGED_FILE = "flagged.jsonl"
SYNTHESIZED_FILE = "synthesized.jsonl"
REJECTIONS_FILE = "rejections.jsonl"
TRAIN_DATA_FILE = "train_data.jsonl"
TRAIN_RECORD_FILE = "train.json"
TRAIN_STEP_FILE = "train-step.json"
EVALUATION_FILE = "eval.jsonl"
FAILURE_ROLLOUTS_FILE = "failure_rollouts.jsonl"
HARD_NEGATIVES_FILE = "hard_negatives.json"

BASELINE_FIGURES_FILE = "evaluation.json"

# The file names a grep finds (tests/test_run_files.py): a folder's bare word ("cycles",
# "adapters") also names a config field or a state key, so only files are listed.
RUN_FILE_NAMES = (
    CONFIG_FILE,
    CHECKPOINTS,
    LOCK_FILE,
    LOG_FILE,
    HISTORY_FILE,
    PATTERNS_FILE,
    SYNTHESIZED_TASKS_FILE,
    CAPABILITY_STATE_FILE,
    TRACKER_RUNS_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    REPORT_FILE,
    BASELINE_FIGURES_FILE,
)
CYCLE_FILE_NAMES = (
    ROLLOUTS_FILE,
    FLAGGED_FILE,
    SYNTHESIZED_FILE,
    REJECTIONS_FILE,
    TRAIN_DATA_FILE,
    TRAIN_RECORD_FILE,
    TRAIN_STEP_FILE,
    EVALUATION_FILE,
    FAILURE_ROLLOUTS_FILE,
    HARD_NEGATIVES_FILE,
)


class _InRun:
    """A file (or folder) of the run directory, read as an attribute of ``RunFiles``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, files: RunFiles, owner: type | None = None) -> Path:
        return files.run_dir / self.name


class RunFiles:
    """The files of the run in ``run_dir`` (see the module docstring)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)

    def __repr__(self) -> str:
        return f"RunFiles({str(self.run_dir)!r})"

    config = _InRun(CONFIG_FILE)
    checkpoints = _InRun(CHECKPOINTS)
    lock = _InRun(LOCK_FILE)
    log = _InRun(LOG_FILE)
    history = _InRun(HISTORY_FILE)
    patterns = _InRun(PATTERNS_FILE)
    task_store = _InRun(TASK_STORE_FOLDER)
    synthesized_tasks = _InRun(SYNTHESIZED_TASKS_FILE)
    capability_state = _InRun(CAPABILITY_STATE_FILE)
    tracker_runs = _InRun(TRACKER_RUNS_FILE)
    tensorboard = _InRun(TENSORBOARD_FOLDER)
    metrics = _InRun(METRICS_FILE)
    summary = _InRun(SUMMARY_FILE)
    report = _InRun(REPORT_FILE)

    def read_synthesized_tasks(self) -> list[Task]:
        """The tasks the run accepted (none before its first)."""
        path = self.synthesized_tasks
        return load_jsonl(path, Task) if path.exists() else []

    def adapter(self, cycle: int) -> Path:
        """The LoRA adapter trained in cycle ``cycle``."""
        return self.run_dir / ADAPTERS_FOLDER / f"cycle-{cycle}"

    def adapters(self) -> list[Path]:
        """The cycles' adapter folders there are (``adapters/cycle-N``), in cycle order;
        finished or not (``training.adapters.is_adapter_complete`` tells)."""
        folder = self.run_dir / ADAPTERS_FOLDER
        found = folder.glob("cycle-*") if folder.is_dir() else []
        numbered = {path: path.name.removeprefix("cycle-") for path in found}
        cycles = {path: int(n) for path, n in numbered.items() if n.isdigit()}
        return sorted(cycles, key=cycles.__getitem__)

    def failure_adapter(self, cycle: int) -> Path:
        """Hard negatives: the failure agent's adapter after cycle ``cycle``."""
        return self.run_dir / ADAPTERS_FOLDER / f"failure-cycle-{cycle}"

    def metrics_rows(self) -> list[dict[str, JsonValue]]:
        """The rows of metrics.jsonl (none before the run finished)."""
        path = self.metrics
        return list(read_jsonl(path)) if path.exists() else []

    def cycle(self, cycle: int) -> CycleFiles:
        return CycleFiles(self.run_dir, cycle)

    def cycles(self) -> list[CycleFiles]:
        """The cycles of the run that have a folder, in order."""
        return CycleFiles.of_run(self.run_dir)


class CycleFiles:
    """One cycle's files, ``<run_dir>/cycles/NNN/``: what each stage writes and a later
    one reads (its folder is made by the first write).

    The cycle graph's state stays small (figures and the cycle number); the
    trajectories, flagged items and tasks of a cycle pass between its nodes through
    these files, written atomically, so a killed run resumes from them:

    rollouts.jsonl           rollout     -> signals, train     (Trajectory; the episodes that ran)
    unreachable-STAGE.jsonl  rollout, evaluate: episodes the endpoint gave no reply for,
                             kept for a person to read (no stage reads them)
    flagged.jsonl            signals     -> synthesize, train  (FlaggedTrajectory)
    synthesized.jsonl        synthesis   -> update_pool, train (Task)
    rejections.jsonl         synthesis: every rejected item with its stage and reason
    train_data.jsonl         train: what the step trained on (``coevolve export``)
    train.json               train: the step's result, so a resumed run reuses it
    train-step.json          train: the step handed to a training process of its own
    eval.jsonl               evaluate: the evaluation episodes
    failure_rollouts.jsonl   hard negatives: the failure agent's episodes
    hard_negatives.json      hard negatives: the step's figures
    """

    def __init__(self, run_dir: str | Path, cycle: int) -> None:
        self.run_dir = Path(run_dir)
        self.cycle = cycle
        self.folder = self.run_dir / CYCLES_FOLDER / f"{cycle:03d}"

    @classmethod
    def of_run(cls, run_dir: str | Path) -> list[CycleFiles]:
        """The cycles of a run that have a folder, in order."""
        folders = sorted((Path(run_dir) / CYCLES_FOLDER).glob("[0-9][0-9][0-9]"))
        return [cls(run_dir, int(folder.name)) for folder in folders]

    def __repr__(self) -> str:
        return f"CycleFiles({str(self.run_dir)!r}, {self.cycle})"

    def _path(self, name: str) -> Path:
        return self.folder / name

    def _write(self, name: str, records: Iterable[BaseModel | Mapping[str, object]]) -> None:
        dump_jsonl(self._path(name), records)

    def _read(self, name: str, model: type[Record]) -> list[Record]:
        """The records of a file; none when the stage has not written it."""
        path = self._path(name)
        return load_jsonl(path, model) if path.exists() else []

    # ----------------------------------------------------------------- rollout
    def rollouts(self) -> list[Trajectory]:
        return self._read(ROLLOUTS_FILE, Trajectory)

    def write_rollouts(self, trajectories: Sequence[Trajectory]) -> None:
        self._write(ROLLOUTS_FILE, trajectories)

    def unreachable(self, stage: str) -> list[Trajectory]:
        """The episodes of ``stage`` (rollout, evaluate) the endpoint gave no usable reply for."""
        return self._read(f"{UNREACHABLE_PREFIX}{stage}.jsonl", Trajectory)

    def write_unreachable(self, stage: str, trajectories: Sequence[Trajectory]) -> None:
        """Keep a stage's left-out episodes for a person to read; a stage run again on
        resume replaces the file, and an empty list removes it."""
        path = self._path(f"{UNREACHABLE_PREFIX}{stage}.jsonl")
        if trajectories:
            self._write(path.name, trajectories)
        elif path.exists():
            path.unlink()

    # ----------------------------------------------------------------- signals
    def flagged(self) -> list[FlaggedTrajectory]:
        return self._read(FLAGGED_FILE, FlaggedTrajectory)

    def write_flagged(self, items: Sequence[FlaggedTrajectory]) -> None:
        self._write(FLAGGED_FILE, items)

    # ----------------------------------------------------------------- synthesis
    def synthesized(self) -> list[Task]:
        return self._read(SYNTHESIZED_FILE, Task)

    def write_synthesized(self, tasks: Sequence[Task]) -> None:
        self._write(SYNTHESIZED_FILE, tasks)

    def write_rejections(self, rejections: Sequence[BaseModel]) -> None:
        self._write(REJECTIONS_FILE, rejections)

    # ----------------------------------------------------------------- train
    @property
    def train_record(self) -> Path:
        """The step's result (a TrainResult, as JSON): present once the step finished."""
        return self._path(TRAIN_RECORD_FILE)

    def write_train_record(self, result: BaseModel) -> None:
        write_atomically(self.train_record, result.model_dump_json(indent=2))

    def train_steps(self) -> int:
        """The optimiser steps the finished step took (0 before it finished)."""
        try:
            return int(json.loads(self.train_record.read_text()).get("steps") or 0)
        except (OSError, ValueError):
            return 0

    @property
    def train_step_spec(self) -> Path:
        """The step handed to a training process of its own (``training.launcher``)."""
        return self._path(TRAIN_STEP_FILE)

    def train_data(self) -> list[dict[str, JsonValue]]:
        """What the step trained on: SFT rows (messages, tools, weight) or DPO pairs."""
        path = self._path(TRAIN_DATA_FILE)
        return list(read_jsonl(path)) if path.exists() else []

    def write_train_data(self, rows: Iterable[BaseModel | Mapping[str, object]]) -> None:
        self._write(TRAIN_DATA_FILE, rows)

    # ----------------------------------------------------------------- evaluate
    @property
    def evaluation_episodes(self) -> Path:
        return self._path(EVALUATION_FILE)

    def write_evaluation(self, trajectories: Sequence[Trajectory]) -> None:
        self._write(EVALUATION_FILE, trajectories)

    # ----------------------------------------------------------------- hard negatives
    def has_failure_rollouts(self) -> bool:
        return self._path(FAILURE_ROLLOUTS_FILE).exists()

    def failure_rollouts(self) -> list[Trajectory]:
        return self._read(FAILURE_ROLLOUTS_FILE, Trajectory)

    def write_failure_rollouts(self, trajectories: Sequence[Trajectory]) -> None:
        self._write(FAILURE_ROLLOUTS_FILE, trajectories)

    def hard_negative_figures(self) -> HardNegativeFigures | None:
        path = self._path(HARD_NEGATIVES_FILE)
        return json.loads(path.read_text()) if path.exists() else None

    def write_hard_negative_figures(self, figures: HardNegativeFigures) -> None:
        write_atomically(self._path(HARD_NEGATIVES_FILE), json.dumps(figures, indent=2) + "\n")


class SharedBaselineFiles:
    """A folder where runs of the same agent share their cycle-0 evaluation (the learning
    bench's arms of one seed): its figures, and a copy of cycle 0's episodes."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    @property
    def figures(self) -> Path:
        return self.folder / BASELINE_FIGURES_FILE

    @property
    def episodes(self) -> Path:
        return self.folder / EVALUATION_FILE
