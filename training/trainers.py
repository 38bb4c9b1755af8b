"""The training step of a cycle: one LoRA adapter trained with TRL (SFT, DPO or GRPO).

``train_adapter`` loads the base model, continues the previous cycle's adapter
(``PeftModel.from_pretrained(..., is_trainable=True)``) or lets TRL start a new
one from ``config.lora.to_peft()`` (passed as ``peft_config``), trains
``config.max_steps`` steps and saves the adapter to ``output_dir`` atomically:
it is written to a sibling temporary directory, ``training.json`` (the
``TrainResult`` and the config) is written last, and the directory is renamed
into place. A directory without ``training.json`` is not a finished adapter.

Each algorithm's trainer is built in its own module, TRL's pairs (``sft_trainer.py``,
``dpo_trainer.py``, ``grpo/grpo_trainer.py`` with GRPO's helpers) from its config section,
which sits beside it (``sft_config.py``: ``training.sft``; ``dpo_config.py``;
``grpo_config.py``).

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

import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..agents.policy.policy_interface import Message
from ..agents.prompts import POLICY_SYSTEM_PROMPT
from ..common.tokenization import load_tokenizer
from ..envs.base import Environment
from ..records import GroupFigures, Task, TrainResult
from .adapters import (
    ADAPTER_MARKER,
    is_adapter_complete,
    load_train_result,
    load_trainable_model,
    save_adapter,
)
from .config import TrainingConfig
from .datasets import PreferencePair, TrainingConversation
from .dpo_trainer import dpo_trainer
from .sft_trainer import sft_trainer
from .step_checkpoints import checkpoint_step, step_checkpoints
from .tokenized_datasets import length_grouped_order, sft_dataset
from .trainer_common import (
    ProgressBars,
    common_arguments,
    quiet_trainer,
    release_memory,
    resolve_device,
    run_trainer,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..outputs.tracking import TrainTracking
    from .seal import CapabilityState

__all__ = [
    "ADAPTER_MARKER",
    "TrainResult",
    "common_arguments",
    "is_adapter_complete",
    "length_grouped_order",
    "load_train_result",
    "load_trainable_model",
    "resolve_device",
    "sft_dataset",
    "train_adapter",
]

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- entry point


def train_adapter(
    config: TrainingConfig,
    *,
    model_dir: str | Path,
    output_dir: str | Path,
    previous_adapter: str | Path | None = None,
    conversations: Sequence[list[Message] | TrainingConversation] = (),
    pairs: Sequence[PreferencePair] = (),
    tasks: Sequence[Task] = (),
    make_env: Callable[[], Environment] | None = None,
    system_prompt: str | None = POLICY_SYSTEM_PROMPT,
    progress: bool = True,
    tracking: TrainTracking | None = None,
    capability_state_path: str | Path | None = None,
    example_weights: Sequence[float] | None = None,
    tools_in_prompt: bool = False,
) -> TrainResult:
    """Train one cycle's LoRA adapter with ``config.algorithm`` and save it to ``output_dir``.

    Data by algorithm: sft reads ``conversations`` (verified successes and
    demonstrations, see ``coevolve.training.datasets``); dpo reads ``pairs``; grpo
    rolls out ``tasks`` in environments from ``make_env`` with ``system_prompt``.
    With nothing to train on, nothing is written and the result says why
    (``skipped``), naming the previous adapter as the one to keep using.
    ``tracking`` sends the trainer's logs to the run's trackers, its steps
    continuing the run's step axis (``coevolve.outputs.tracking``).
    ``example_weights``: sft only, one loss weight per conversation (SEAL's
    diagnosis weights, ``weighted_sft_trainer_class``); None trains unweighted.
    ``capability_state_path``: with SEAL reweighting, where the label statistics
    and dynamic weights live between cycles; read (if there), its window reset
    (SEAL resets it each epoch; a cycle is ours), and written back after training.
    ``tools_in_prompt``: GRPO's prompts carry the tool schemas, as the policy's do
    (``PolicyConfig.renders_tools``); SFT and DPO examples carry their own tools.
    """
    output = Path(output_dir)
    reason = _nothing_to_train(config, conversations, pairs, tasks, make_env)
    if reason is not None:
        return _skipped(config, previous_adapter, reason)
    if config.algorithm == "grpo":
        if config.grpo.warmup_ratio is not None:
            config = config.model_copy(update={"warmup_ratio": config.grpo.warmup_ratio})
        if config.grpo.demonstration_steps and conversations:
            return _demonstrations_then_grpo(
                config,
                model_dir=model_dir,
                output_dir=output,
                previous_adapter=previous_adapter,
                conversations=conversations,
                tasks=tasks,
                make_env=make_env,
                system_prompt=system_prompt,
                progress=progress,
                tracking=tracking,
                capability_state_path=capability_state_path,
                tools_in_prompt=tools_in_prompt,
            )
    return _train_with_trl(
        config,
        model_dir=model_dir,
        output=output,
        previous_adapter=previous_adapter,
        conversations=conversations,
        pairs=pairs,
        tasks=tasks,
        make_env=make_env,
        system_prompt=system_prompt,
        progress=progress,
        tracking=tracking,
        capability_state_path=capability_state_path,
        example_weights=example_weights,
        tools_in_prompt=tools_in_prompt,
    )


def _skipped(
    config: TrainingConfig, previous_adapter: str | Path | None, reason: str
) -> TrainResult:
    """A step that trained nothing, for ``reason``: the previous adapter stays in use."""
    logger.info("training skipped: %s", reason)
    previous = str(previous_adapter) if previous_adapter is not None else None
    return TrainResult(
        algorithm=config.algorithm,
        adapter_dir=previous,
        previous_adapter=previous,
        skipped=reason,
    )


def _train_with_trl(
    config: TrainingConfig,
    *,
    model_dir: str | Path,
    output: Path,
    previous_adapter: str | Path | None,
    conversations: Sequence[list[Message] | TrainingConversation],
    pairs: Sequence[PreferencePair],
    tasks: Sequence[Task],
    make_env: Callable[[], Environment] | None,
    system_prompt: str | None,
    progress: bool,
    tracking: TrainTracking | None,
    capability_state_path: str | Path | None,
    example_weights: Sequence[float] | None,
    tools_in_prompt: bool,
) -> TrainResult:
    """One TRL trainer's step of ``train_adapter``: build it, run it (from the step's last
    checkpoint, when a killed run left one), save the adapter, and free the memory."""
    device = resolve_device(config)
    # transformers 5 warns about its own renamed attribute inside Trainer: not the user's concern.
    warnings.filterwarnings(
        "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
    )
    tokenizer = load_tokenizer(model_dir)
    checkpoints, resume_from = step_checkpoints(
        config, output, model_dir, previous_adapter, len(conversations), len(pairs), len(tasks)
    )
    # The trainer's output_dir: a temporary folder, or the step's checkpoint folder.
    work = checkpoints or Path(tempfile.mkdtemp(prefix="coevolve-train-"))
    bars = ProgressBars()
    try:
        capability_state = _grpo_capability_state(config, capability_state_path)
        trainer, examples, reason = _make_trainer(
            config,
            model_dir=model_dir,
            previous_adapter=previous_adapter,
            tokenizer=tokenizer,
            conversations=conversations,
            pairs=pairs,
            tasks=tasks,
            make_env=make_env,
            system_prompt=system_prompt,
            arguments=(device, work, progress, tracking),
            capability_state=capability_state,
            example_weights=example_weights,
            tools_in_prompt=tools_in_prompt,
        )
        if trainer is None:
            return _skipped(config, previous_adapter, reason or "nothing to train on")
        quiet_trainer(trainer, progress)
        if tracking is not None:
            tracking.attach(trainer)
        if resume_from is not None:
            logger.info("training resumes from the checkpoint %s", resume_from)
        previous = str(previous_adapter) if previous_adapter is not None else None
        result = _run(trainer, config, output, previous, examples, device, resume_from)
        if trainer.is_world_process_zero():
            if capability_state is not None and capability_state_path is not None:
                capability_state.save(capability_state_path)
            if checkpoints is not None:
                shutil.rmtree(checkpoints, ignore_errors=True)  # the adapter is saved: done
        return result
    finally:
        bars.restore()
        if checkpoints is None:
            shutil.rmtree(work, ignore_errors=True)
        trainer = None  # the model, optimizer and data go with it
        release_memory()


def _nothing_to_train(
    config: TrainingConfig,
    conversations: Sequence[object],
    pairs: Sequence[PreferencePair],
    tasks: Sequence[Task],
    make_env: Callable[[], Environment] | None,
) -> str | None:
    """Why ``config.algorithm`` has nothing to train on (None: it has); GRPO without
    ``make_env`` is an error."""
    if config.algorithm == "sft" and not conversations:
        return "no conversations to fine-tune on (no verified success or demonstration)"
    if config.algorithm == "dpo" and not pairs:
        return "no (success, failure) pairs of the same task"
    if config.algorithm == "grpo":
        if make_env is None:
            raise ValueError(
                "GRPO needs make_env (a factory of fresh environments) for its rewards"
            )
        if not tasks:
            return "no tasks to roll out"
    return None


def _grpo_capability_state(
    config: TrainingConfig, capability_state_path: str | Path | None
) -> CapabilityState | None:
    """GRPO's SEAL label statistics, read with their window reset (None: not reweighting)."""
    if config.algorithm != "grpo":
        return None
    from .seal import CapabilityState

    if not (config.seal.reweight.enable and capability_state_path is not None):
        return None
    capability_state = CapabilityState.load(capability_state_path)
    capability_state.reset_window()
    return capability_state


def _make_trainer(
    config: TrainingConfig,
    *,
    model_dir: str | Path,
    previous_adapter: str | Path | None,
    tokenizer: Any,
    conversations: Sequence[list[Message] | TrainingConversation],
    pairs: Sequence[PreferencePair],
    tasks: Sequence[Task],
    make_env: Callable[[], Environment] | None,
    system_prompt: str | None,
    arguments: tuple[str, Path, bool, TrainTracking | None],
    capability_state: CapabilityState | None,
    example_weights: Sequence[float] | None,
    tools_in_prompt: bool,
) -> tuple[Any, int, str | None]:
    """The TRL trainer of ``config.algorithm`` (None with the reason when there is nothing
    to train on) and how many examples it trains on. ``arguments``: the device, the
    trainer's output folder, whether to show progress, and the tracking."""
    device, work, progress, tracking = arguments
    if config.algorithm == "grpo":
        from .grpo.grpo_trainer import make_grpo_trainer

        assert make_env is not None
        return make_grpo_trainer(
            config,
            model_dir=model_dir,
            previous_adapter=previous_adapter,
            tokenizer=tokenizer,
            tasks=tasks,
            make_env=make_env,
            system_prompt=system_prompt,
            arguments=common_arguments(config, device, work, progress, tracking),
            capability_state=capability_state,
            tools_in_prompt=tools_in_prompt,
            replay_conversations=conversations,
        )
    if config.algorithm == "dpo":
        return dpo_trainer(
            config, model_dir, previous_adapter, tokenizer, pairs, device, work, progress, tracking
        )
    return sft_trainer(
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


def _run(
    trainer: Any,
    config: TrainingConfig,
    output: Path,
    previous: str | None,
    examples: int,
    device: str,
    resume_from: str | None,
) -> TrainResult:
    """Run the trainer (from ``resume_from``, a checkpoint) and save its adapter to
    ``output`` (on the main process), with the step's figures."""
    steps, final_loss, mean_loss, elapsed, metrics = run_trainer(trainer, resume_from)
    result = TrainResult(
        algorithm=config.algorithm,
        adapter_dir=str(output),
        previous_adapter=previous,
        steps=steps,
        examples=examples,
        final_loss=final_loss,
        mean_loss=mean_loss,
        mean_reward=metrics.get("reward") if config.algorithm == "grpo" else None,
        groups=group_figures(metrics) if config.algorithm == "grpo" else None,
        train_time_s=round(elapsed, 3),
        steps_per_s=round(steps / elapsed, 3) if elapsed > 0 else None,
        device=device,
        world_size=trainer.args.world_size,
        resumed_from_step=checkpoint_step(resume_from),
    )
    # Under `accelerate launch` every rank trains (same max_steps) but one writes:
    # trainer.model is the unwrapped model, the same on every rank under DDP. FSDP
    # shards it: gather the full weights first, on every rank (as Trainer.save_model).
    state_dict = None
    if getattr(trainer, "is_fsdp_enabled", False):
        state_dict = trainer.accelerator.get_state_dict(trainer.model)
    if trainer.is_world_process_zero():
        save_adapter(trainer.model, output, result, config, state_dict)
    return result


def train_merged(
    training: TrainingConfig,
    base: Path,
    work: Path,
    conversations: Sequence[list[Message] | TrainingConversation],
    progress: bool,
) -> tuple[TrainResult, Any]:
    """A LoRA SFT of ``base`` on ``conversations`` (``train_adapter``), merged into the
    weights and saved with the tokenizer in ``work``: (the step's result, the merged model)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = work / "adapter"
    result = train_adapter(
        training, model_dir=base, output_dir=adapter, conversations=conversations, progress=progress
    )
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(str(work))
    load_tokenizer(base).save_pretrained(str(work))
    shutil.rmtree(adapter, ignore_errors=True)
    return result, merged


def _demonstrations_then_grpo(
    config: TrainingConfig,
    *,
    output_dir: Path,
    previous_adapter: str | Path | None,
    conversations: Sequence[list[Message] | TrainingConversation],
    **step: Any,
) -> TrainResult:
    """``grpo.demonstration_steps`` SFT steps on the all-fail tasks' demonstrations and GRPO
    for the rest of ``max_steps``, each from the other's adapter, in ``grpo.demonstration_order``:
    one result (GRPO's figures, the last part's adapter), both steps counted."""
    sft = config.model_copy(
        update={
            "algorithm": "sft",
            "max_steps": config.grpo.demonstration_steps,
            "learning_rate": config.grpo.demonstration_learning_rate or config.learning_rate,
            # The GRPO step's memory bound holds for its SFT steps too (a step of 8
            # demonstrations at once took a tuning unit to 15.5 GB).
            "sft": config.sft.model_copy(update={"micro_batch_size": config.grpo.micro_batch_size}),
            "seal": config.seal.model_copy(
                update={"reweight": config.seal.reweight.model_copy(update={"enable": False})}
            ),
        }
    )
    # The GRPO part has no demonstration steps of its own; it gets their conversations
    # only to anchor its steps on them (grpo.replay_coefficient).
    grpo = config.model_copy(
        update={
            "max_steps": config.max_steps - config.grpo.demonstration_steps,
            "grpo": config.grpo.model_copy(update={"demonstration_steps": 0}),
        }
    )
    step = {**step, "conversations": conversations}
    sft_step = {key: value for key, value in step.items() if key != "tasks"}
    parts = [(sft, "-demonstrations", sft_step), (grpo, "-grpo", step)]
    if config.grpo.demonstration_order != "first":
        parts.reverse()
    # The first part trains beside the output folder, the last from its adapter into it.
    (first_config, suffix, first_step), (last_config, _, last_step) = parts
    first = train_adapter(
        first_config,
        output_dir=output_dir.with_name(output_dir.name + suffix),
        previous_adapter=previous_adapter,
        **first_step,
    )
    last = train_adapter(
        last_config, output_dir=output_dir, previous_adapter=first.adapter_dir, **last_step
    )
    demonstrated, trained = (first, last) if first_config is sft else (last, first)
    return trained.model_copy(
        update={
            "adapter_dir": last.adapter_dir,
            "previous_adapter": str(previous_adapter) if previous_adapter is not None else None,
            "steps": demonstrated.steps + trained.steps,
            "train_time_s": round(demonstrated.train_time_s + trained.train_time_s, 3),
            "demonstration_steps": demonstrated.steps,
        }
    )


def group_figures(metrics: dict[str, float]) -> GroupFigures:
    """The GRPO groups' spread from the trainer's logged means."""
    return GroupFigures(
        without_reward_spread=metrics.get("frac_reward_zero_std"),
        with_spread=metrics.get("dynamic/groups_with_spread"),
        dropped=metrics.get("dynamic/dropped"),
        refilled=metrics.get("dynamic/refilled"),
        final_with_spread=metrics.get("dynamic/final_with_spread"),
        all_failed=metrics.get("reference/all_fail_groups"),
        given_reference=metrics.get("reference/replaced"),
    )
