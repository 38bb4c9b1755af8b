"""What every TRL trainer of ours shares: the training device, common arguments, quiet
library progress bars with one step bar of our own, the trainer's log dicts sent to a
logger, running a trainer, releasing memory."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import TrainingConfig

if TYPE_CHECKING:  # pragma: no cover
    from ..outputs.tracking import TrainTracking


def resolve_device(config: TrainingConfig) -> str:
    """``cpu`` or ``cuda`` for ``config.device`` (auto: cuda when available)."""
    import torch

    if config.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "device is 'cuda' but no CUDA device is available; use device: auto or cpu"
        )
    if config.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return config.device


def common_arguments(
    config: TrainingConfig,
    device: str,
    output_dir: Path,
    progress: bool,
    tracking: TrainTracking | None = None,
) -> dict[str, Any]:
    """Arguments every TRL config of ours shares (CPU-safe precision, no checkpoints); reports
    go to ``tracking``'s trackers (none without it)."""
    import torch

    on_gpu = device == "cuda"
    reports = tracking.arguments() if tracking is not None else {"report_to": "none"}
    return {
        "output_dir": str(output_dir),
        "max_steps": config.max_steps,
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "learning_rate": config.learning_rate,
        "lr_scheduler_type": config.lr_scheduler,
        "warmup_steps": config.warmup_ratio,
        "weight_decay": config.weight_decay,
        "use_cpu": not on_gpu,
        "bf16": on_gpu and torch.cuda.is_bf16_supported(),
        "fp16": False,
        "gradient_checkpointing": False,
        "activation_checkpointing": config.activation_checkpointing,
        # checkpoint_every: the trainer's own checkpoints, the last one kept (resumable).
        **(
            {"save_strategy": "steps", "save_steps": config.checkpoint_every, "save_total_limit": 1}
            if config.checkpoint_every
            else {"save_strategy": "no"}
        ),
        "logging_steps": 1,
        "logging_strategy": "steps",
        # Our own one-line bar (_StepBar) replaces tqdm and the printed log dicts.
        "disable_tqdm": True,
        "seed": config.seed,
        "data_seed": config.seed,
        "dataloader_num_workers": 0,
        # Under DDP every LoRA weight gets a gradient each step: skip the search for unused
        # parameters (an extra autograd traversal per step, and a warning per rank).
        "ddp_find_unused_parameters": False,
        **reports,
    }


class ProgressBars:
    """Turns off datasets' and transformers' progress bars during a step, and back on after.

    A person sees one bar per stage (``_StepBar``), not the dataset-map bars of
    tokenization or weight loading.
    """

    def __init__(self) -> None:
        import datasets
        from transformers.utils import logging as transformers_logging

        self.datasets_were_on = datasets.is_progress_bar_enabled()
        self.transformers_were_on = transformers_logging.is_progress_bar_enabled()
        datasets.disable_progress_bars()
        transformers_logging.disable_progress_bar()

    def restore(self) -> None:
        import datasets
        from transformers.utils import logging as transformers_logging

        if self.datasets_were_on:
            datasets.enable_progress_bars()
        if self.transformers_were_on:
            transformers_logging.enable_progress_bar()


def _step_bar(total: int) -> Any:
    """A trainer callback drawing one rich progress bar: steps, loss, seconds per step."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers import TrainerCallback

    class StepBar(TrainerCallback):
        def __init__(self) -> None:
            self.bar = Progress(
                TextColumn("train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[loss]}"),
                transient=True,
            )
            self.task = self.bar.add_task("train", total=total, loss="")

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self.bar.start()
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self.bar.update(self.task, completed=state.global_step)
            return control

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> Any:
            if logs and "loss" in logs:
                self.bar.update(self.task, loss=f"loss {float(logs['loss']):.3f}")
            return control

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self.bar.stop()
            return control

    return StepBar()


# The trainer's log dicts, one record per logging step: a run writes them to its run.log
# (coevolve.outputs.run_log); `coevolve run --verbose` shows them on the terminal too.
TRAINER_LOGGER = "coevolve.trainer"


def _log_records() -> Any:
    """A trainer callback logging each of the trainer's log dicts to ``TRAINER_LOGGER``."""
    from transformers import TrainerCallback

    logger = logging.getLogger(TRAINER_LOGGER)

    class LogRecords(TrainerCallback):
        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> Any:
            if logs:
                logger.info("step %d: %s", state.global_step, logs)
            return control

    return LogRecords()


def quiet_trainer(trainer: Any, progress: bool) -> None:
    # Without tqdm, transformers prints every log dict to stdout instead: never here; they
    # go to the trainer logger.
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(_log_records())
    if progress:
        trainer.add_callback(_step_bar(trainer.args.max_steps))


def run_trainer(
    trainer: Any, resume_from: str | None = None
) -> tuple[int, float | None, float | None, float, dict[str, float]]:
    """Train (from the checkpoint ``resume_from`` when given); return (steps, final loss,
    mean loss, seconds, mean of other logged metrics)."""
    started = time.perf_counter()
    output = trainer.train(resume_from_checkpoint=resume_from)
    elapsed = time.perf_counter() - started
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    losses = [float(entry["loss"]) for entry in history]
    metrics: dict[str, list[float]] = {}
    for entry in history:
        for key, value in entry.items():
            if isinstance(value, int | float):
                metrics.setdefault(key, []).append(float(value))
    means = {key: sum(values) / len(values) for key, values in metrics.items()}
    mean_loss = float(output.training_loss) if output.training_loss is not None else None
    return trainer.state.global_step, (losses[-1] if losses else None), mean_loss, elapsed, means


def release_memory() -> None:
    """Give the training step's memory back: a step peaks at several GB (logits over the
    vocabulary), and glibc keeps freed blocks in the process unless asked to return them."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators with ``seed``."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def micro_batches(config: TrainingConfig, micro_batch_size: int | None) -> dict[str, int]:
    """``per_device_train_batch_size`` and ``gradient_accumulation_steps`` for
    ``micro_batch_size`` examples per forward pass (the largest divisor of ``batch_size``
    up to it; None: ``batch_size`` at once), still ``batch_size x
    gradient_accumulation_steps`` examples per optimisation step."""
    micro = micro_batch_size or config.batch_size
    micro = max(
        d for d in range(1, min(micro, config.batch_size) + 1) if config.batch_size % d == 0
    )
    return {
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": config.gradient_accumulation_steps
        * (config.batch_size // micro),
    }
