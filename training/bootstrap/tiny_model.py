"""The tiny from-scratch bootstrap model (``base: tiny``): the Qwen2 model, its dataset,
the SFT trainer with its schedule and thread tuning, and the build that ties them together."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..chat_template import observation_mask, tokenize_for_training
from ..trainer_common import quiet_trainer
from .bootstrap_config import RECIPE_VERSION, build_stamp
from .corpus import augment_corpus, build_corpus
from .tiny_tokenizer import _template_texts, train_tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

    from ...agents.policy.policy_interface import Message
    from .bootstrap_config import BootstrapConfig


def build_model(config: BootstrapConfig, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A randomly initialised Qwen2 causal LM sized by ``config``, tied embeddings."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(config.seed)
    model_config = Qwen2Config(  # type: ignore[call-arg]
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
    )
    model = Qwen2ForCausalLM(model_config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    return model


def parameter_count(model: PreTrainedModel) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def training_dataset(
    tokenizer: PreTrainedTokenizerFast,
    conversations: list[list[Message]],
    loss_on_observations: bool = False,
) -> Any:
    """A ``datasets.Dataset`` of ``input_ids`` and ``assistant_masks``.

    Token ids rather than messages: tool-call argument dicts of different keys
    would become null-filled structs in Arrow. SFTTrainer turns the masks into
    labels (-100 outside assistant turns), exactly what ``assistant_only_loss``
    does for a conversational dataset.
    """
    from datasets import Dataset

    rows = [tokenize_for_training(tokenizer, messages) for messages in conversations]
    if loss_on_observations:
        for row in rows:
            extra = observation_mask(tokenizer, row["input_ids"])
            row["assistant_masks"] = [
                a | b for a, b in zip(row["assistant_masks"], extra, strict=True)
            ]
    return Dataset.from_list(rows)


class TrainingSchedule:
    """Learning-rate factor and stopping by training progress.

    Progress is ``max(step / max_steps, elapsed / time_budget_s)``: warm-up over
    the first ``warmup_ratio`` of it, then decay (cosine, linear or none) to zero
    at progress 1, where training stops. Without a time budget this is the
    usual step schedule.
    """

    def __init__(self, config: BootstrapConfig) -> None:
        self.kind = config.lr_scheduler
        self.warmup = config.warmup_ratio
        self.max_steps = config.max_steps
        self.budget_s = config.time_budget_s
        self.started: float | None = None

    def start(self) -> None:
        self.started = time.perf_counter()

    def progress(self, step: int) -> float:
        progress = step / self.max_steps
        if self.budget_s is not None and self.started is not None:
            progress = max(progress, (time.perf_counter() - self.started) / self.budget_s)
        return min(progress, 1.0)

    def factor(self, step: int) -> float:
        import math

        progress = self.progress(step)
        if progress < self.warmup:
            return max(progress / self.warmup, 1e-3)
        if self.kind == "constant":
            return 1.0
        rest = (progress - self.warmup) / max(1.0 - self.warmup, 1e-9)
        if self.kind == "linear":
            return max(0.0, 1.0 - rest)
        return 0.5 * (1.0 + math.cos(math.pi * rest))


class ThreadTuner:
    """Picks the faster of one thread and all threads, and keeps checking.

    On an idle machine all cores are fastest; on a busy one PyTorch's threads
    wait for each other and a single thread can be several times faster. Every
    ``every`` steps the other setting runs for ``probe`` steps and the one with
    the lower median step time is kept. A fixed ``num_threads`` turns this off.
    """

    def __init__(self, num_threads: int | None, every: int = 100, probe: int = 6) -> None:
        import torch

        self.fixed = num_threads
        self.options = sorted({1, max(torch.get_num_threads(), 1)})
        self.every, self.probe = every, probe
        self.current = num_threads or self.options[-1]
        torch.set_num_threads(self.current)
        self.times: dict[int, list[float]] = {option: [] for option in self.options}
        self.steps = 0
        self.probing: int | None = None  # the setting on trial, while a probe runs
        self.probe_left = 0
        self.started = 0.0
        self.switches: list[tuple[int, int]] = []  # (step, threads) at each change

    def step_begin(self) -> None:
        self.started = time.perf_counter()

    def step_end(self) -> None:
        if self.fixed is not None or len(self.options) == 1:
            return
        import torch

        elapsed = time.perf_counter() - self.started
        used = self.probing if self.probing is not None else self.current
        self.times[used] = [*self.times[used][-(self.probe - 1) :], elapsed]
        self.steps += 1
        if self.probing is not None:
            self.probe_left -= 1
            if self.probe_left <= 0:
                if _median(self.times[self.probing]) < _median(self.times[self.current]):
                    self.current = self.probing
                    self.switches.append((self.steps, self.current))
                self.probing = None
                torch.set_num_threads(self.current)
        elif self.steps % self.every == self.probe and len(self.times[self.current]) >= self.probe:
            self.probing = next(o for o in self.options if o != self.current)
            self.times[self.probing] = []
            self.probe_left = self.probe
            torch.set_num_threads(self.probing)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("inf")


def make_trainer(
    config: BootstrapConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    dataset: Any,
    output_dir: Path,
    progress: bool = True,
    schedule: TrainingSchedule | None = None,
) -> Any:
    """TRL's SFTTrainer set up for CPU training of the small model (no checkpoints).

    The learning rate follows ``schedule`` (default: ``TrainingSchedule(config)``),
    which also stops training when its progress reaches 1.
    """
    import transformers
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import TrainerCallback
    from trl import SFTTrainer

    active: TrainingSchedule = schedule or TrainingSchedule(config)

    class Trainer(SFTTrainer):
        thread_tuner: ThreadTuner

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            if self.lr_scheduler is None:
                self.lr_scheduler = LambdaLR(optimizer or self.optimizer, active.factor)  # type: ignore[arg-type]
                self._created_lr_scheduler = True
            return self.lr_scheduler

    threads = ThreadTuner(config.num_threads)

    class ScheduleAndThreads(TrainerCallback):
        """Stops where the schedule's progress reaches 1; re-decides between one and all CPU
        threads as the machine's load changes."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            active.start()
            return control

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            threads.step_begin()
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if active.progress(state.global_step) >= 1.0:
                control.should_training_stop = True
            threads.step_end()
            return control

    args = _sft_arguments(config, output_dir)
    transformers.logging.set_verbosity_error()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[ScheduleAndThreads()],
    )
    trainer.thread_tuner = threads
    # The log dicts go to the trainer logger, never to stdout (tqdm's bar wrote them
    # there): a quiet build (`coevolve bootstrap --json`) prints nothing of its own.
    quiet_trainer(trainer, progress)
    return trainer


def _sft_arguments(config: BootstrapConfig, output_dir: Path) -> Any:
    """TRL's ``SFTConfig`` for the small model: CPU, no checkpoints, the recipe's batch,
    learning rate and length, its seed for the data order too."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(output_dir),
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        max_length=config.max_length,
        # The dataset is pre-tokenized with the assistant mask of the training template;
        # SFTTrainer builds the labels from that mask (assistant_only_loss needs messages).
        assistant_only_loss=False,
        completion_only_loss=False,
        packing=False,
        train_sampling_strategy="group_by_length",
        use_cpu=True,
        bf16=False,
        fp16=False,
        activation_checkpointing=False,
        save_strategy="no",
        report_to="none",
        logging_steps=max(1, min(25, config.max_steps // 10)),
        logging_strategy="steps",
        disable_tqdm=True,  # quiet_trainer's step bar instead
        seed=config.seed,
        data_seed=config.seed,
        dataloader_num_workers=0,
    )


def _say(progress: bool, text: str) -> None:
    if progress:
        print(f"[bootstrap] {text}", flush=True)


def build_tiny_bootstrap(config: BootstrapConfig, work: Path, progress: bool) -> dict[str, Any]:
    import torch

    started = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    conversations = build_corpus(config)
    texts = _template_texts(conversations)
    tokenizer = train_tokenizer(texts, config)
    examples = augment_corpus(conversations, config)
    dataset = training_dataset(tokenizer, examples, config.loss_on_observations)
    lengths = [len(ids) for ids in dataset["input_ids"]]
    _say(
        progress,
        f"{len(conversations)} demonstrations, vocabulary {len(tokenizer)}, "
        f"{sum(lengths) / len(lengths):.0f} tokens each on average (longest {max(lengths)})",
    )
    model = build_model(config, tokenizer)
    parameters = parameter_count(model)
    _say(progress, f"model: Qwen2 with {parameters / 1e6:.2f}M parameters")
    trainer = make_trainer(config, model, tokenizer, dataset, work / "trainer", progress=progress)
    train_started = time.perf_counter()
    threads_before = torch.get_num_threads()
    try:
        result = trainer.train()
    finally:
        torch.set_num_threads(threads_before)
    train_time = time.perf_counter() - train_started
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    shutil.rmtree(work / "trainer", ignore_errors=True)
    model = trainer.model
    model.eval()
    model.save_pretrained(str(work))
    tokenizer.save_pretrained(str(work))
    steps = trainer.state.global_step
    _say(progress, f"trained {steps} steps in {train_time:.0f}s ({steps / train_time:.2f} steps/s)")
    return {
        "config": config.model_dump(),
        "cache_key": config.cache_key(),
        "recipe_version": RECIPE_VERSION,
        "parameters": parameters,
        "vocab_size": len(tokenizer),
        "train_demonstrations": len(conversations),
        "train_examples": len(examples),
        "mean_tokens_per_example": round(sum(lengths) / len(lengths), 1),
        "max_tokens_per_example": max(lengths),
        "steps": steps,
        "stopped_by_time_budget": steps < config.max_steps,
        "threads": {
            "final": trainer.thread_tuner.current,
            "switches": trainer.thread_tuner.switches,
        },
        "train_time_s": round(train_time, 1),
        "steps_per_s": round(steps / train_time, 3) if train_time > 0 else None,
        "build_time_s": round(time.perf_counter() - started, 1),
        "final_loss": losses[-1] if losses else result.training_loss,
        "mean_train_loss": result.training_loss,
        **build_stamp(),
    }
