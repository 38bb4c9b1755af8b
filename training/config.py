"""Configuration of the training step of a cycle: algorithm, LoRA shape, optimiser, per-algorithm knobs.

One config serves CPU and GPU (``device``); LoRA is always on (``lora``), and
each cycle's adapter continues from the previous cycle's. See docs/training.md
for why the defaults are what they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..common.config_base import Section
from ..records import Algorithm
from .dpo_config import DpoConfig
from .grpo_config import GrpoConfig
from .seal import SealConfig
from .sft_config import SftConfig

if TYPE_CHECKING:  # pragma: no cover
    from peft import LoraConfig

ALGORITHMS: tuple[Algorithm, ...] = ("sft", "grpo", "dpo")
Device = Literal["auto", "cpu", "cuda"]
LrScheduler = Literal["cosine", "linear", "constant"]
Launcher = Literal["inprocess", "subprocess", "accelerate"]

# Attention and MLP projections of Qwen2 (and of most Llama-style decoders).
QWEN2_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraAdapterConfig(BaseModel):
    """Shape of the LoRA adapter trained each cycle (ignored when continuing: the previous
    adapter keeps its own shape)."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(default=16, gt=0, description="Rank of the low-rank update matrices.")
    alpha: int = Field(
        default=32,
        gt=0,
        description="LoRA scaling numerator: the update is scaled by alpha / r (2 is the usual ratio).",
    )
    dropout: float = Field(
        default=0.05, ge=0.0, lt=1.0, description="Dropout on the adapter's input during training."
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(QWEN2_PROJECTIONS),
        min_length=1,
        description="Names of the linear layers that get an adapter (default: every attention "
        "and MLP projection of Qwen2). 'lm_head' is refused for GRPO, which reads the head's "
        "weight directly.",
    )
    top_layers: int | None = Field(
        default=None,
        gt=0,
        description="Put adapters only in the last N transformer blocks (None: all). Backward "
        "then stops N blocks from the top, which roughly halves a CPU step on a 30-block model "
        "such as SmolLM2 with N=10.",
    )

    def to_peft(self, num_layers: int | None = None) -> LoraConfig:
        """The ``peft.LoraConfig`` handed to TRL as ``peft_config``.

        ``num_layers`` (the model's block count) is needed when ``top_layers`` is set.
        """
        from peft import LoraConfig

        layers = None
        if self.top_layers is not None:
            if num_layers is None:
                raise ValueError("top_layers needs the model's num_layers")
            layers = list(range(max(num_layers - self.top_layers, 0), num_layers))
        return LoraConfig(
            layers_to_transform=layers,
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )


class TrainingConfig(Section):
    """How one cycle trains its LoRA adapter (TRL SFT, DPO or GRPO): what every algorithm
    shares here, each algorithm's own knobs in its section (``sft``, ``dpo``, ``grpo``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    algorithm: Algorithm = Field(
        default="sft",
        description="sft: rejection-sampling fine-tuning on verified successes and reference "
        "demonstrations; dpo: preference optimisation on (success, failure) pairs of the same task; "
        "grpo: group-relative policy optimisation with the environment's verifier as reward.",
    )
    lora: LoraAdapterConfig = Field(
        default_factory=LoraAdapterConfig, description="Shape of a new adapter."
    )
    device: Device = Field(
        default="auto",
        description="Where to train: cuda when available (auto), or forced. On CPU training "
        "runs in float32 without activation checkpointing; on a GPU in bf16 where supported.",
    )
    # ------------------------------------------------------------------ optimiser
    learning_rate: float = Field(
        default=5e-4,
        gt=0,
        description="Peak learning rate (AdamW). LoRA wants a higher rate than full fine-tuning; "
        "small models tolerate more than 7B ones (1e-4 to 2e-4 there).",
    )
    lr_scheduler: LrScheduler = Field(
        default="cosine", description="Decay after warm-up (cosine matters for small models)."
    )
    warmup_ratio: float = Field(
        default=0.05, ge=0.0, lt=1.0, description="Fraction of max_steps spent warming up."
    )
    weight_decay: float = Field(default=0.0, ge=0.0, description="AdamW weight decay.")
    max_steps: int = Field(
        default=50,
        gt=0,
        description="Optimisation steps per cycle. Size it from measured steps/s (docs/training.md).",
    )
    batch_size: int = Field(
        default=8,
        gt=0,
        description="Sequences per micro-batch (SFT: conversations; DPO: pairs; GRPO: completions).",
    )
    gradient_accumulation_steps: int = Field(
        default=1, gt=0, description="Micro-batches per optimisation step."
    )
    max_length: int = Field(
        default=1024,
        gt=0,
        description="Longest training sequence in tokens (SFT conversation; DPO prompt + completion); "
        "longer ones are cut.",
    )
    activation_checkpointing: bool = Field(
        default=False,
        description="Keep only each layer's input in the forward pass and recompute the rest "
        "in the backward (TrainingArguments.activation_checkpointing): the same losses, 5-40% "
        "more time a step, and activations of a few MB instead of about 2.8 MB a token "
        "on SmolLM2's 30 layers (docs/benchmarks/memory.md). For a laptop or a long context.",
    )
    seed: int = Field(
        default=0, description="Seed of adapter initialisation, data order, sampling."
    )
    sft: SftConfig = Field(default_factory=SftConfig, description="The SFT step's knobs.")
    dpo: DpoConfig = Field(default_factory=DpoConfig, description="The DPO step's knobs.")
    grpo: GrpoConfig = Field(default_factory=GrpoConfig, description="The GRPO step's knobs.")
    # ------------------------------------------------------------------ launching
    launcher: Launcher = Field(
        default="inprocess",
        description="Where the step runs. inprocess: a thread of the loop process (one device); "
        "subprocess: one child process (python -m coevolve.training SPEC.json), which gives "
        "its memory back when it exits; accelerate: `accelerate launch --config_file "
        "accelerate_config -m coevolve.training SPEC.json`, N processes (DDP, DeepSpeed, FSDP). "
        "The loop builds the data either way; the child reads it from the step spec.",
    )
    accelerate_config: str | None = Field(
        default=None,
        description="launcher accelerate: an accelerate config YAML, as a path or as the name "
        "of one shipped in configs/accelerate (ddp-cpu, ddp, deepspeed-zero2, fsdp).",
    )
    num_processes: int | None = Field(
        default=None,
        ge=1,
        description="launcher accelerate: processes to start (accelerate launch "
        "--num_processes), overriding the accelerate config's num_processes; None keeps the "
        "config's. batch_size is per process: the global batch is batch_size x "
        "gradient_accumulation_steps x processes.",
    )
    checkpoint_every: int | None = Field(
        default=None,
        gt=0,
        description="Save a trainer checkpoint (adapter, optimizer, scheduler, RNG states, "
        "step) every N optimisation steps, in adapters/.checkpoints/cycle-N/, the last one "
        "kept; a killed step (a killed run, a launched step's process) then continues from "
        "its last checkpoint when the run resumes, instead of from step 0. Removed once the "
        "adapter is saved. None: no checkpoints (a killed step restarts).",
    )
    # ------------------------------------------------------------------ seal
    seal: SealConfig = Field(
        default_factory=SealConfig,
        description="SEAL: diagnosis-guided GRPO advantage weights and the training-only "
        "interface of GRPO episodes; all off by default (coevolve.training.seal).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainingConfig:
        problems = [
            *self._demonstration_problems(),
            *self._feature_problems(),
            *self._launcher_problems(),
            *self._grpo_round_problems(),
            *self._vllm_problems(),
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _demonstration_problems(self) -> list[str]:
        """GRPO's demonstration steps: room for them in max_steps, and the settings that
        need some."""
        problems = []
        if self.algorithm == "grpo" and self.grpo.demonstration_steps >= self.max_steps:
            problems.append(
                f"grpo.demonstration_steps ({self.grpo.demonstration_steps}) leaves no GRPO step "
                f"of max_steps ({self.max_steps}): lower it or raise max_steps"
            )
        if self.grpo.demonstration_order == "last" and not self.grpo.demonstration_steps:
            problems.append(
                "grpo.demonstration_order: last orders the demonstration steps, and "
                "grpo.demonstration_steps is 0: set it (e.g. 4) or leave the order at first"
            )
        if self.grpo.replay_coefficient and not self.grpo.demonstration_steps:
            problems.append(
                "grpo.replay_coefficient weighs the demonstration steps' conversations in each "
                "GRPO step, and grpo.demonstration_steps is 0: set it (e.g. 4) or set "
                "replay_coefficient to 0"
            )
        for replay in ("replay_successes", "replay_pool"):
            if getattr(self.grpo, replay) and not self.grpo.demonstration_steps:
                problems.append(
                    f"grpo.{replay} trains in the demonstration steps, and "
                    f"grpo.demonstration_steps is 0: set it (e.g. 4) or turn {replay} off"
                )
        return problems

    def _feature_problems(self) -> list[str]:
        """Features the algorithm or the launcher cannot run: dynamic sampling across processes,
        SEAL's weights under DPO, its dynamic weights under SFT."""
        problems = []
        if (
            self.algorithm == "grpo"
            and self.grpo.dynamic_sampling
            and self.launcher == "accelerate"
        ):
            problems.append(
                "grpo.dynamic_sampling refills one process's groups and would break the others' "
                "share of the round: set launcher: inprocess or subprocess, or "
                "grpo.dynamic_sampling: false"
            )
        if self.seal.reweight.enable and self.algorithm == "dpo":
            problems.append(
                "seal.reweight weights GRPO advantages or SFT examples, but algorithm is 'dpo'; "
                "set algorithm: grpo or sft, or seal.reweight.enable: false"
            )
        if self.seal.reweight.dynamic.enable and self.algorithm == "sft":
            problems.append(
                "seal.reweight.dynamic updates the weights from GRPO rollouts; SFT weighs each "
                "example by the fixed table: set seal.reweight.dynamic.enable: false"
            )
        return problems

    def _launcher_problems(self) -> list[str]:
        """The launcher's settings: accelerate_config with accelerate only, num_processes too."""
        problems = []
        if self.launcher == "accelerate" and self.accelerate_config is None:
            problems.append(
                "launcher 'accelerate' needs accelerate_config: a YAML path or a shipped name "
                "(e.g. accelerate_config: ddp, or ddp-cpu on a CPU)"
            )
        if self.launcher != "accelerate" and self.accelerate_config is not None:
            problems.append(
                f"accelerate_config is set but launcher is {self.launcher!r}; set launcher: "
                "accelerate, or remove accelerate_config"
            )
        if self.launcher != "accelerate" and self.num_processes is not None:
            problems.append(
                f"num_processes is set but launcher is {self.launcher!r} (one process); set "
                "launcher: accelerate with an accelerate_config, or remove num_processes"
            )
        return problems

    def _grpo_round_problems(self) -> list[str]:
        """A GRPO round's episodes against the batches, LoRA on lm_head, and room for the
        prompt (nothing to check for the other algorithms)."""
        problems: list[str] = []
        if self.algorithm != "grpo":
            return problems
        episodes = self.grpo.prompts_per_step * self.grpo.num_generations
        processes = self.num_processes or 1
        if processes > 1 and episodes % (self.batch_size * processes):
            problems.append(
                f"a GRPO round has {episodes} episodes, which the global batch "
                f"(batch_size x num_processes = {self.batch_size * processes}) must divide; "
                "lower batch_size or raise grpo.prompts_per_step"
            )
        elif episodes % self.batch_size:
            problems.append(
                f"a GRPO round has grpo.prompts_per_step x grpo.num_generations = {episodes} "
                f"episodes, which batch_size ({self.batch_size}) must divide; e.g. batch_size="
                f"{self.grpo.num_generations} or grpo.prompts_per_step a multiple of "
                f"{self.batch_size}"
            )
        elif (episodes // self.batch_size) % self.gradient_accumulation_steps:
            problems.append(
                f"a GRPO round has {episodes // self.batch_size} micro-batches, which "
                f"gradient_accumulation_steps ({self.gradient_accumulation_steps}) must divide; "
                "lower gradient_accumulation_steps or change grpo.prompts_per_step"
            )
        if "lm_head" in self.lora.target_modules:
            problems.append(
                "GRPO cannot train a LoRA on lm_head (TRL computes log-probabilities from "
                "lm_head.weight directly); remove 'lm_head' from lora.target_modules"
            )
        if self.grpo.max_completion_length >= self.max_length:
            problems.append(
                f"grpo.max_completion_length ({self.grpo.max_completion_length}) leaves no room "
                f"for the prompt within max_length ({self.max_length}); lower it or raise max_length"
            )
        return problems

    def _vllm_problems(self) -> list[str]:
        """vLLM generates GRPO episodes, on a GPU."""
        problems = []
        if self.grpo.vllm != "off" and self.algorithm != "grpo":
            problems.append(
                f"grpo.vllm is {self.grpo.vllm!r} but algorithm is {self.algorithm!r}; vLLM "
                "generates GRPO episodes only: set algorithm: grpo or grpo.vllm: off"
            )
        if self.grpo.vllm != "off" and self.device == "cpu":
            problems.append(
                "grpo.vllm needs a GPU but device is 'cpu'; set grpo.vllm: off on a CPU"
            )
        return problems
