"""The training step of a cycle: one LoRA adapter trained with TRL (SFT, DPO or GRPO).

``train_adapter`` loads the base model, continues the previous cycle's adapter
(``PeftModel.from_pretrained(..., is_trainable=True)``) or lets TRL start a new
one from ``config.lora.to_peft()`` (passed as ``peft_config``), trains
``config.max_steps`` steps and saves the adapter to ``output_dir`` atomically:
it is written to a sibling temporary directory, ``training.json`` (the
``TrainResult`` and the config) is written last, and the directory is renamed
into place. A directory without ``training.json`` is not a finished adapter.

- **sft**: rejection-sampling fine-tuning. Conversations are tokenized with the
  training chat template (``tokenize_for_training``, as the bootstrap does), so
  the loss falls on assistant tokens only, ``<|im_end|>`` included.
- **dpo**: TRL's ``DPOTrainer`` on (success, failure) pairs of one task. The
  prompt is the opening (system + request) rendered with a generation prompt;
  chosen and rejected are the rest of each conversation as the chat template
  renders it (tool calls and tool results included). Pairs go to TRL as text,
  never as argument dicts. The reference model is the base model (the adapter
  disabled), also when continuing an adapter.
- **grpo**: TRL's ``GRPOTrainer`` with the environment as ``environment_factory``
  and its verifier score as reward; see ``coevolve.training.grpo``.

The same config trains on CPU (``use_cpu``, float32, no activation
checkpointing) and on a GPU (bf16 where supported).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ..agents.policy import Message
from ..agents.prompts import POLICY_SYSTEM_PROMPT
from ..envs.base import Environment
from ..records import Task
from ..tokenization import load_tokenizer
from .config import Algorithm, TrainingConfig
from .datasets import PreferencePair

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from ..tracking import TrainTracking

logger = logging.getLogger(__name__)

ADAPTER_MARKER = "training.json"


class TrainResult(BaseModel):
    """What one training step did; also stored as ``training.json`` in the adapter directory."""

    model_config = ConfigDict(extra="forbid")

    algorithm: Algorithm
    adapter_dir: str | None = Field(
        description="The new adapter; when skipped, the previous adapter (or None)."
    )
    previous_adapter: str | None = None
    steps: int = 0
    examples: int = Field(
        default=0, description="Conversations (sft), pairs (dpo) or tasks (grpo) trained on."
    )
    final_loss: float | None = None
    mean_loss: float | None = None
    mean_reward: float | None = Field(default=None, description="GRPO: mean episode reward.")
    train_time_s: float = 0.0
    steps_per_s: float | None = None
    device: str | None = None
    skipped: str | None = Field(
        default=None, description="Why nothing was trained (no data); None when trained."
    )


# --------------------------------------------------------------------------- adapters


def is_adapter_complete(path: str | Path) -> bool:
    """A finished adapter: ``training.json`` (written last) is there and readable."""
    try:
        json.loads((Path(path) / ADAPTER_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (Path(path) / "adapter_config.json").exists()


def load_train_result(path: str | Path) -> TrainResult:
    """The ``TrainResult`` stored with a finished adapter."""
    return TrainResult.model_validate(
        json.loads((Path(path) / ADAPTER_MARKER).read_text())["result"]
    )


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


def load_trainable_model(
    model_dir: str | Path, previous_adapter: str | Path | None = None
) -> PreTrainedModel:
    """The base model in float32, with the previous adapter loaded trainable when one is given.

    Without a previous adapter the plain model comes back and the trainer adds a
    new LoRA from ``peft_config``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if previous_adapter is None:
        return model
    if not (Path(previous_adapter) / "adapter_config.json").exists():
        raise FileNotFoundError(
            f"no LoRA adapter at {previous_adapter} (adapter_config.json missing); "
            "pass previous_adapter=None to start a new one"
        )
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(previous_adapter), is_trainable=True)  # type: ignore[return-value]


def _save_adapter(
    model: Any, output_dir: Path, result: TrainResult, config: TrainingConfig
) -> None:
    """Write the adapter beside ``output_dir``, marker last, then rename it into place."""
    from ..files import atomic_directory

    with atomic_directory(output_dir, hidden=True) as work:
        model.save_pretrained(str(work))
        metadata = {"result": result.model_dump(), "config": config.model_dump()}
        (work / ADAPTER_MARKER).write_text(json.dumps(metadata, indent=2) + "\n")


# --------------------------------------------------------------------------- trainer arguments


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
        "activation_checkpointing": False,
        "save_strategy": "no",
        "logging_steps": 1,
        "logging_strategy": "steps",
        # Our own one-line bar (_StepBar) replaces tqdm and the printed log dicts.
        "disable_tqdm": True,
        "seed": config.seed,
        "data_seed": config.seed,
        "dataloader_num_workers": 0,
        **reports,
    }


class _ProgressBars:
    """Turns off datasets' and transformers' progress bars during a step, and back on after.

    A person sees one bar per stage (``_StepBar``), not the dataset-map bars of
    tokenization or weight loading.
    """

    def __init__(self, progress: bool):
        import datasets
        from transformers.utils import logging as transformers_logging

        self.progress = progress
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


def _quiet(trainer: Any, progress: bool) -> None:
    # Without tqdm, transformers prints every log dict to stdout instead: never here.
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    if progress:
        trainer.add_callback(_step_bar(trainer.args.max_steps))


def _run(trainer: Any) -> tuple[int, float | None, float | None, float, dict[str, float]]:
    """Train; return (steps, final loss, mean loss, seconds, mean of other logged metrics)."""
    started = time.perf_counter()
    output = trainer.train()
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


# --------------------------------------------------------------------------- datasets per algorithm


def sft_dataset(
    tokenizer: PreTrainedTokenizerBase,
    conversations: Sequence[list[Message]],
    example_weights: Sequence[float] | None = None,
) -> Any:
    """``input_ids`` and ``assistant_masks`` per conversation (the bootstrap's tokenization),
    and ``example_weight`` when weights are given."""
    from datasets import Dataset

    from .chat_template import tokenize_for_training

    rows: list[dict[str, Any]] = [tokenize_for_training(tokenizer, list(m)) for m in conversations]
    if example_weights is not None:
        if len(example_weights) != len(rows):
            raise ValueError(
                f"{len(example_weights)} example weights for {len(rows)} conversations"
            )
        rows = [
            {**row, "example_weight": float(w)}
            for row, w in zip(rows, example_weights, strict=True)
        ]
    return Dataset.from_list(rows)


def length_grouped_order(
    lengths: Sequence[int], batch_size: int, rows: int, seed: int, window_batches: int = 4
) -> list[int]:
    """Indices of ``rows`` training rows, in batch order, for sequential sampling.

    Each pass over the data is a fresh shuffle, cut into windows of
    ``window_batches`` batches; a window is sorted by length and cut into
    batches, so a batch pads little, and the batches of a pass are shuffled again,
    so long and short conversations keep meeting the whole learning-rate schedule.
    """
    import random

    if batch_size < 1 or window_batches < 1:
        raise ValueError("batch_size and window_batches must be >= 1")
    if not lengths:
        return []
    generator = random.Random(seed)
    order: list[int] = []
    window = batch_size * window_batches
    while len(order) < rows:
        indices = list(range(len(lengths)))
        generator.shuffle(indices)
        batches: list[list[int]] = []
        for start in range(0, len(indices), window):
            chunk = sorted(indices[start : start + window], key=lambda i: lengths[i])
            batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
        generator.shuffle(batches)
        order.extend(index for batch in batches for index in batch)
    return order[:rows]


class _WeightedCollator:
    """TRL's collator, plus the batch's ``example_weight`` tensor (TRL drops unknown keys)."""

    def __init__(self, inner: Any):
        self.inner = inner

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        weights = [float(example["example_weight"]) for example in examples]
        stripped = [{k: v for k, v in e.items() if k != "example_weight"} for e in examples]
        batch = self.inner(stripped)
        batch["example_weight"] = torch.tensor(weights, dtype=torch.float32)
        return batch


def weighted_sft_trainer_class() -> Any:
    """An SFTTrainer whose loss is mean over examples of weight x the example's token-mean loss.

    SEAL's per-example weights (``coevolve.training.seal.trajectory_weight``) for SFT.
    Each example's loss is its own token mean, so a long conversation counts as one
    example, not by its length (TRL's unweighted loss is a token mean over the batch).
    """
    import torch
    from trl import SFTTrainer

    class WeightedSFTTrainer(SFTTrainer):
        def compute_loss(
            self,
            model: Any,
            inputs: Any,
            return_outputs: Any = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            weights = inputs.pop("example_weight")
            labels = inputs.pop("labels")
            outputs = model(**inputs, use_cache=False)
            logits = outputs.logits[:, :-1].float()
            target = labels[:, 1:].to(logits.device)
            per_token = torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), target, ignore_index=-100, reduction="none"
            )
            mask = (target != -100).float()
            per_example = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            loss = (per_example * weights.to(per_example.device)).mean()
            return (loss, outputs) if return_outputs else loss

    return WeightedSFTTrainer


def dpo_dataset(tokenizer: PreTrainedTokenizerBase, pairs: Sequence[PreferencePair]) -> Any:
    """Text ``prompt``/``chosen``/``rejected`` as the chat template renders the conversations.

    The prompt ends with the generation prompt; chosen and rejected are what the
    template renders after it, ending at the last ``<|im_end|>`` (TRL appends the
    end-of-sequence token only when it is missing). A pair whose rendering does not
    start with its rendered prompt is dropped.
    """
    from datasets import Dataset

    from .chat_template import render

    eos = tokenizer.eos_token or ""
    rows = []
    for pair in pairs:
        prompt = render(tokenizer, pair.prompt, add_generation_prompt=True)
        completions = []
        for rest in (pair.chosen, pair.rejected):
            full = render(tokenizer, [*pair.prompt, *rest])
            if not full.startswith(prompt):
                break
            text = full[len(prompt) :].rstrip()
            if eos and eos in text:
                text = text[: text.rindex(eos) + len(eos)]
            completions.append(text)
        if len(completions) == 2 and all(completions):
            rows.append({"prompt": prompt, "chosen": completions[0], "rejected": completions[1]})
        else:
            logger.warning(
                "preference pair of %s does not render as prompt + completion", pair.task_id
            )
    return Dataset.from_list(rows) if rows else None


# --------------------------------------------------------------------------- entry point


def train_adapter(
    config: TrainingConfig,
    *,
    model_dir: str | Path,
    output_dir: str | Path,
    previous_adapter: str | Path | None = None,
    conversations: Sequence[list[Message]] = (),
    pairs: Sequence[PreferencePair] = (),
    tasks: Sequence[Task] = (),
    make_env: Callable[[], Environment] | None = None,
    system_prompt: str | None = POLICY_SYSTEM_PROMPT,
    progress: bool = True,
    tracking: TrainTracking | None = None,
    capability_state_path: str | Path | None = None,
    example_weights: Sequence[float] | None = None,
) -> TrainResult:
    """Train one cycle's LoRA adapter with ``config.algorithm`` and save it to ``output_dir``.

    Data by algorithm: sft reads ``conversations`` (verified successes and
    demonstrations, see ``coevolve.training.datasets``); dpo reads ``pairs``; grpo
    rolls out ``tasks`` in environments from ``make_env`` with ``system_prompt``.
    With nothing to train on, nothing is written and the result says why
    (``skipped``), naming the previous adapter as the one to keep using.
    ``tracking`` sends the trainer's logs to the run's trackers, its steps
    continuing the run's step axis (``coevolve.tracking``).
    ``example_weights``: sft only, one loss weight per conversation (SEAL's
    diagnosis weights, ``weighted_sft_trainer_class``); None trains unweighted.
    ``capability_state_path``: with SEAL reweighting, where the label statistics
    and dynamic weights live between cycles; read (if there), its window reset
    (SEAL resets it each epoch; a cycle is ours), and written back after training.
    """
    output = Path(output_dir)
    previous = str(previous_adapter) if previous_adapter is not None else None

    def skipped(reason: str) -> TrainResult:
        logger.info("training skipped: %s", reason)
        return TrainResult(
            algorithm=config.algorithm,
            adapter_dir=previous,
            previous_adapter=previous,
            skipped=reason,
        )

    if config.algorithm == "sft" and not conversations:
        return skipped("no conversations to fine-tune on (no verified success or demonstration)")
    if config.algorithm == "dpo" and not pairs:
        return skipped("no (success, failure) pairs of the same task")
    if config.algorithm == "grpo":
        if make_env is None:
            raise ValueError(
                "GRPO needs make_env (a factory of fresh environments) for its rewards"
            )
        if not tasks:
            return skipped("no tasks to roll out")

    device = resolve_device(config)
    # transformers 5 warns about its own renamed attribute inside Trainer: not the user's concern.
    warnings.filterwarnings(
        "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
    )
    tokenizer = load_tokenizer(model_dir)
    work = Path(tempfile.mkdtemp(prefix="coevolve-train-"))
    bars = _ProgressBars(progress)
    try:
        capability_state = None
        if config.algorithm == "grpo":
            from .grpo import make_grpo_trainer
            from .seal import CapabilityState

            assert make_env is not None
            if config.seal.reweight.enable and capability_state_path is not None:
                capability_state = CapabilityState.load(capability_state_path)
                capability_state.reset_window()
            trainer, examples, reason = make_grpo_trainer(
                config,
                model_dir=model_dir,
                previous_adapter=previous_adapter,
                tokenizer=tokenizer,
                tasks=tasks,
                make_env=make_env,
                system_prompt=system_prompt,
                arguments=common_arguments(config, device, work, progress, tracking),
                capability_state=capability_state,
            )
        elif config.algorithm == "dpo":
            trainer, examples, reason = _dpo_trainer(
                config,
                model_dir,
                previous_adapter,
                tokenizer,
                pairs,
                device,
                work,
                progress,
                tracking,
            )
        else:
            trainer, examples, reason = _sft_trainer(
                config,
                model_dir,
                previous_adapter,
                tokenizer,
                conversations,
                device,
                work,
                progress,
                tracking,
                example_weights,
            )
        if trainer is None:
            return skipped(reason or "nothing to train on")
        _quiet(trainer, progress)
        if tracking is not None:
            tracking.attach(trainer)
        steps, final_loss, mean_loss, elapsed, metrics = _run(trainer)
        result = TrainResult(
            algorithm=config.algorithm,
            adapter_dir=str(output),
            previous_adapter=previous,
            steps=steps,
            examples=examples,
            final_loss=final_loss,
            mean_loss=mean_loss,
            mean_reward=metrics.get("reward") if config.algorithm == "grpo" else None,
            train_time_s=round(elapsed, 3),
            steps_per_s=round(steps / elapsed, 3) if elapsed > 0 else None,
            device=device,
        )
        _save_adapter(trainer.model, output, result, config)
        if capability_state is not None and capability_state_path is not None:
            capability_state.save(capability_state_path)
        return result
    finally:
        bars.restore()
        shutil.rmtree(work, ignore_errors=True)
        trainer = None  # the model, optimizer and data go with it
        _release_memory()


def _release_memory() -> None:
    """Give the training step's memory back: a step peaks at several GB (logits over the
    vocabulary), and glibc keeps freed blocks in the process unless asked to return them."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _model_and_peft(
    config: TrainingConfig, model_dir: str | Path, previous_adapter: str | Path | None
) -> tuple[Any, Any]:
    """(model, peft_config): a new LoRA through TRL, or the previous adapter already attached."""
    model = load_trainable_model(model_dir, previous_adapter)
    if previous_adapter is not None:
        return model, None
    return model, config.lora.to_peft(getattr(model.config, "num_hidden_layers", None))


def _sft_trainer(
    config: TrainingConfig,
    model_dir: str | Path,
    previous_adapter: str | Path | None,
    tokenizer: Any,
    conversations: Sequence[list[Message]],
    device: str,
    work: Path,
    progress: bool,
    tracking: TrainTracking | None = None,
    example_weights: Sequence[float] | None = None,
) -> tuple[Any, int, str | None]:
    import transformers
    from trl import SFTConfig, SFTTrainer

    dataset = sft_dataset(tokenizer, conversations, example_weights)
    weighted = example_weights is not None
    grouped = config.sft_batching == "length_grouped"
    if grouped:
        rows = config.max_steps * config.batch_size * config.gradient_accumulation_steps
        lengths = [len(ids) for ids in dataset["input_ids"]]
        dataset = dataset.select(
            length_grouped_order(lengths, config.batch_size, rows, config.seed)
        )
    args = SFTConfig(
        **common_arguments(config, device, work, progress, tracking),
        # The weight column is no model input; keep it for the collator.
        remove_unused_columns=not weighted,
        max_length=config.max_length,
        # Pre-tokenized with the assistant mask of the training template; SFTTrainer
        # turns the mask into labels (assistant_only_loss itself needs messages).
        assistant_only_loss=False,
        completion_only_loss=False,
        packing=False,
        # Shuffled batches, either plain or length-grouped in our own order (read in
        # sequence). Not transformers' group_by_length: it sorts each window of up to 50
        # batches longest first, so a short run (32 bootstrap steps) met the long chains
        # at the full learning rate and the short families only in the schedule's tail:
        # 18% on validation against 33% shuffled (docs/benchmarks.md).
        train_sampling_strategy="sequential" if grouped else "random",
    )
    model, peft_config = _model_and_peft(config, model_dir, previous_adapter)
    transformers.logging.set_verbosity_error()
    trainer_class: Any = weighted_sft_trainer_class() if weighted else SFTTrainer
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    if weighted:
        trainer.data_collator = _WeightedCollator(trainer.data_collator)
    return trainer, len(conversations), None


def _dpo_trainer(
    config: TrainingConfig,
    model_dir: str | Path,
    previous_adapter: str | Path | None,
    tokenizer: Any,
    pairs: Sequence[PreferencePair],
    device: str,
    work: Path,
    progress: bool,
    tracking: TrainTracking | None = None,
) -> tuple[Any, int, str | None]:
    import transformers
    from trl import DPOConfig, DPOTrainer

    dataset = dpo_dataset(tokenizer, pairs)
    if dataset is None:
        return None, 0, "no preference pair renders as prompt + completion"
    args = DPOConfig(
        **common_arguments(config, device, work, progress, tracking),
        beta=config.dpo_beta,
        max_length=config.max_length,
        precompute_ref_log_probs=False,
    )
    model, peft_config = _model_and_peft(config, model_dir, previous_adapter)
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        trainer = DPOTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=peft_config,
        )
    return trainer, len(dataset), None
