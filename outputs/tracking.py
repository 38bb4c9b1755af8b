"""Experiment tracking: TRL's ``report_to`` for training, and the loop's figures in the same run.

``tracking.report_to`` (``none``, ``tensorboard``, ``trackio``, ``wandb``,
``mlflow``) is handed to every TRL trainer a run builds, through the
ecosystem's own integrations (transformers' callbacks), with the run's name
and project. The loop's own figures (held-out success overall and per
family, flagged counts by signal, synthesis counts and rejection reasons,
pool size, seconds per stage) are logged per cycle to the same backends and
run. One step axis: training steps continue across cycles (cycle 2's first
step follows cycle 1's last), and a cycle's loop figures are logged at the
training step the cycle ended on (the baseline at step 0).

TensorBoard writes to ``<run_dir>/tensorboard`` (``tensorboard --logdir
runs``: every run side by side); Trackio keeps a local database
(``trackio show``); W&B and MLflow follow their own settings (environment
variables such as ``WANDB_MODE=offline`` or ``MLFLOW_TRACKING_URI``).
Heavy libraries are imported only when a backend is used.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..common.errors import PROGRAMMING_ERRORS
from ..run_files import TENSORBOARD_FOLDER, CycleFiles, RunFiles

if TYPE_CHECKING:  # pragma: no cover
    from .summary import CycleSummary

log = logging.getLogger(__name__)

Backend = Literal["none", "tensorboard", "trackio", "wandb", "mlflow"]
# The package each backend needs, and how to install it.
PACKAGES = {
    "tensorboard": ("tensorboard", "pip install 'coevolve[dev]' (or pip install tensorboard)"),
    "trackio": ("trackio", "pip install 'coevolve[trackio]'"),
    "wandb": ("wandb", "pip install 'coevolve[wandb]'"),
    "mlflow": ("mlflow", "pip install 'coevolve[mlflow]'"),
}


class TrackingConfig(BaseModel):
    """Where a run's figures go: TensorBoard, Trackio, W&B or MLflow (or nowhere)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    report_to: list[Backend] = Field(
        default_factory=lambda: list[Backend](["none"]),
        min_length=1,
        description="Trackers that receive training metrics (through TRL's report_to) and the "
        "loop's figures per cycle: none, or any of tensorboard, trackio, wandb, mlflow.",
    )
    project: str = Field(
        default="coevolve", description="Project name (Trackio, W&B; the MLflow experiment)."
    )
    run_name: str | None = Field(
        default=None, description="Run name in the trackers (None: the run directory's name)."
    )
    logging_dir: str | None = Field(
        default=None,
        description=f"TensorBoard event files (None: <run_dir>/{TENSORBOARD_FOLDER}).",
    )

    @model_validator(mode="after")
    def _none_alone(self) -> TrackingConfig:
        if "none" in self.report_to and len(self.report_to) > 1:
            raise ValueError(
                f"report_to {self.report_to} names 'none' with trackers; give [none] alone, "
                "or only trackers"
            )
        return self

    def backends(self) -> list[str]:
        return [b for b in self.report_to if b != "none"]

    def name_for(self, run_dir: str | Path) -> str:
        return self.run_name or Path(run_dir).resolve().name

    def tensorboard_dir(self, run_dir: str | Path) -> Path:
        return Path(self.logging_dir) if self.logging_dir else RunFiles(run_dir).tensorboard


def require_backends(config: TrackingConfig) -> None:
    """Raise RuntimeError naming the install command of every configured backend that is missing."""
    import importlib.util

    missing = [b for b in config.backends() if importlib.util.find_spec(PACKAGES[b][0]) is None]
    if missing:
        how = "; ".join(f"{b}: {PACKAGES[b][1]}" for b in missing)
        raise RuntimeError(
            f"tracking.report_to names {', '.join(missing)}, which is not installed ({how}); "
            "or drop it from tracking.report_to"
        )


# --------------------------------------------------------------------------- training


class TrainTracking(BaseModel):
    """What one cycle's trainer reports, and where its steps start on the run's axis."""

    model_config = ConfigDict(extra="forbid")

    config: TrackingConfig
    run_dir: str
    step_offset: int = Field(default=0, ge=0, description="Training steps of earlier cycles.")
    wandb_run_id: str | None = Field(
        default=None, description="The loop's W&B run, which a launched step logs into."
    )
    mlflow_run_id: str | None = Field(
        default=None, description="The loop's MLflow run, which a launched step logs into."
    )

    def environment(self) -> dict[str, str]:
        """What a launched training process sets so that transformers' W&B and MLflow
        callbacks log into the loop's own runs instead of opening new ones."""
        variables: dict[str, str] = {}
        if self.wandb_run_id is not None:
            variables |= {
                "WANDB_RUN_ID": self.wandb_run_id,
                "WANDB_RESUME": "allow",
                "WANDB_PROJECT": self.config.project,
            }
        if self.mlflow_run_id is not None:
            variables |= {
                "MLFLOW_RUN_ID": self.mlflow_run_id,
                "MLFLOW_EXPERIMENT_NAME": self.config.project,
            }
        return variables

    def arguments(self) -> dict[str, Any]:
        """TRL/transformers arguments: report_to, run_name, project (Trackio stays local)."""
        backends = self.config.backends()
        if not backends:
            return {"report_to": "none"}
        return {
            "report_to": backends,
            "run_name": self.config.name_for(self.run_dir),
            "project": self.config.project,
            "trackio_static_space_id": False,
        }

    def attach(self, trainer: Any) -> None:
        """Point the TensorBoard callback at the run's directory and shift the step axis."""
        for callback in trainer.callback_handler.callbacks:
            if type(callback).__name__ == "TensorBoardCallback":
                callback.logging_dir = str(self.config.tensorboard_dir(self.run_dir))
        if self.step_offset:
            from transformers import TrainerCallback

            class Shift(TrainerCallback):
                def __init__(self, by: int) -> None:
                    self.by = by

                def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                    state.global_step += self.by

            # Every integration reads state.global_step in on_log: it sees the run's step.
            trainer.callback_handler.callbacks.insert(0, Shift(self.step_offset))
            trainer.callback_handler.callbacks.append(Shift(-self.step_offset))


def steps_before(run_dir: str | Path, cycle: int) -> int:
    """Training steps of cycles 1..cycle-1, from their finished steps' records."""
    return sum(CycleFiles(run_dir, earlier).train_steps() for earlier in range(1, cycle))


def for_training(config: Any, run_dir: str | Path, cycle: int) -> TrainTracking:
    """The ``TrainTracking`` of cycle ``cycle`` of a run with CoevolveConfig ``config``: its
    step offset, and the loop's W&B and MLflow runs (made now if the run has none yet)."""
    backends = config.tracking.backends()
    mlflow_run = None
    if "mlflow" in backends:
        try:
            mlflow_run = mlflow_run_id(config.tracking, run_dir)
        except PROGRAMMING_ERRORS:
            raise
        except Exception as err:  # boundary: the tracker's store, not the run
            log.warning("tracking: no MLflow run to share with the training step: %s", err)
    return TrainTracking(
        config=config.tracking,
        run_dir=str(run_dir),
        step_offset=steps_before(run_dir, cycle),
        wandb_run_id=wandb_run_id(run_dir) if "wandb" in backends else None,
        mlflow_run_id=mlflow_run,
    )


def wandb_run_id(run_dir: str | Path) -> str:
    """The run's W&B run id: fixed by its run directory, so the loop, every launched step and
    a resumed run all log into one W&B run."""
    import hashlib

    digest = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()
    return f"coevolve-{digest[:12]}"


def mlflow_run_id(tracking: TrackingConfig, run_dir: str | Path) -> str:
    """The run's MLflow run id (MLflow assigns it): made on first use, then kept in
    ``<run_dir>/tracker_runs.json``."""
    from ..common.files import write_atomically

    record = RunFiles(run_dir).tracker_runs
    runs: dict[str, str] = json.loads(record.read_text()) if record.exists() else {}
    if "mlflow" not in runs:
        import mlflow

        mlflow.set_experiment(tracking.project)
        with mlflow.start_run(run_name=tracking.name_for(run_dir)) as started:
            runs["mlflow"] = started.info.run_id
        write_atomically(record, json.dumps(runs, indent=2))
    return runs["mlflow"]


# --------------------------------------------------------------------------- loop figures


def cycle_metrics(summary: CycleSummary) -> dict[str, float]:
    """The scalars of one cycle's summary (the figures metrics.jsonl holds), by tracker name."""
    metrics: dict[str, float] = {"cycle": float(summary.cycle)}

    def put(prefix: str, figures: Any, *names: str) -> None:
        metrics.update({f"{prefix}/{name}": float(getattr(figures, name)) for name in names})

    evaluation = summary.evaluate
    if evaluation is not None:  # None: not evaluated this cycle (evaluation.every)
        put("heldout", evaluation, "success", "tool_sequence", "left_out")
        for family, rate in evaluation.by_family.items():
            metrics[f"heldout/success/{family}"] = rate
    if summary.rollout is not None:
        put("rollout", summary.rollout, "success", "episodes", "left_out")
    if summary.signals is not None:
        put("signals", summary.signals, "flagged", "kept")
        for kind, count in summary.signals.by_kind.items():
            metrics[f"signals/{kind}"] = float(count)
    if (synthesis := summary.synthesize) is not None:
        put("synthesis", synthesis, "candidates", "judged_ok", "duplicates", "accepted")
        for reason, count in synthesis.top_rejections.items():
            metrics[f"synthesis/rejected/{_slug(reason)}"] = float(count)
    if summary.pool is not None:
        put("pool", summary.pool, "size", "added", "seed", "synthesized")
    if (train := summary.train) is not None:
        metrics["train/cycle_steps"] = float(train.steps)
        if train.final_loss is not None:
            metrics["train/cycle_final_loss"] = train.final_loss
        if train.groups is not None:  # GRPO: how many groups had reward spread
            for name, value in train.groups.model_dump().items():
                if value is not None:
                    metrics[f"train/groups/{name}"] = value
    for stage, seconds in summary.stage_seconds().items():
        metrics[f"time/{stage}_s"] = seconds
    return metrics


def _slug(text: str) -> str:
    """A tracker-safe metric name from a free-text reason (its first words)."""
    words = re.sub(r"[^a-z0-9]+", "_", str(text).split(" (")[0].lower()).strip("_")
    return words[:48] or "other"


_TENSORBOARD_WRITERS: dict[str, Any] = {}


class _Logged(NamedTuple):
    """What each tracker's logger takes: one finished cycle's figures and where they go."""

    tracking: TrackingConfig
    run_dir: str | Path
    metrics: dict[str, float]
    step: int
    summary: CycleSummary


def log_cycle(config: Any, run_dir: str | Path, summary: CycleSummary) -> None:
    """Log one finished cycle's figures to every configured tracker, at the run's training step.

    ``config`` is the run's CoevolveConfig. A tracker that fails is logged as a
    warning: tracking never stops a run.
    """
    tracking: TrackingConfig = config.tracking
    backends = tracking.backends()
    if not backends:
        return
    cycle = summary.cycle
    step = steps_before(run_dir, cycle + 1)
    logged = _Logged(tracking, run_dir, cycle_metrics(summary), step, summary)
    for backend in backends:
        try:
            _LOGGERS[backend](logged)
        except PROGRAMMING_ERRORS:
            raise
        except Exception as err:  # boundary: third-party trackers and their servers, not the run
            log.warning("tracking: %s could not log cycle %d: %s", backend, cycle, err)


def _tensorboard(logged: _Logged) -> None:
    from torch.utils.tensorboard import SummaryWriter

    directory = str(logged.tracking.tensorboard_dir(logged.run_dir))
    writer = _TENSORBOARD_WRITERS.get(directory)
    if writer is None:
        writer = _TENSORBOARD_WRITERS[directory] = SummaryWriter(log_dir=directory)
    for name, value in logged.metrics.items():
        writer.add_scalar(name, value, logged.step)
    reasons = logged.summary.synthesize.top_rejections if logged.summary.synthesize else {}
    if reasons:
        table = "\n".join(f"- {count} × {reason}" for reason, count in reasons.items())
        writer.add_text("synthesis/rejection_reasons", table, logged.step)
    writer.flush()


def _trackio(logged: _Logged) -> None:
    import trackio

    name = logged.tracking.name_for(logged.run_dir)
    trackio.init(project=logged.tracking.project, name=name, resume="allow")
    trackio.log(logged.metrics, step=logged.step)


def _wandb(logged: _Logged) -> None:
    import wandb

    if wandb.run is None:
        wandb.init(
            id=wandb_run_id(logged.run_dir),
            project=logged.tracking.project,
            name=logged.tracking.name_for(logged.run_dir),
            resume="allow",
        )
    wandb.log({**logged.metrics, "train/global_step": logged.step})


def _mlflow(logged: _Logged) -> None:
    import mlflow

    if mlflow.active_run() is None:
        mlflow.set_experiment(logged.tracking.project)
        mlflow.start_run(run_id=mlflow_run_id(logged.tracking, logged.run_dir))
    mlflow.log_metrics(path_safe(logged.metrics), step=logged.step)


def path_safe(metrics: dict[str, float]) -> dict[str, float]:
    """Metric names that a store keeping one file per name can hold: a name that is also the
    folder of others (heldout/success beside heldout/success/<family>) becomes NAME/all."""
    return {
        (f"{name}/all" if any(other.startswith(name + "/") for other in metrics) else name): value
        for name, value in metrics.items()
    }


def release_shared_runs() -> None:
    """End this process's W&B run before a training step of its own process logs into it
    (W&B refuses a run id that another process holds); the loop's next figures resume it."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish()


_LOGGERS = {"tensorboard": _tensorboard, "trackio": _trackio, "wandb": _wandb, "mlflow": _mlflow}


def close() -> None:
    """Flush and close the TensorBoard writers this process opened."""
    while _TENSORBOARD_WRITERS:
        _directory, writer = _TENSORBOARD_WRITERS.popitem()
        writer.close()
