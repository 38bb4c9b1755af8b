"""Configuration of the training step of a cycle: algorithm, LoRA shape, optimiser, per-algorithm knobs.

One config serves CPU and GPU (``device``); LoRA is always on (``lora``), and
each cycle's adapter continues from the previous cycle's. See docs/training.md
for why the defaults are what they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..common.config_base import Section
from .seal import SealSettings

if TYPE_CHECKING:  # pragma: no cover
    from peft import LoraConfig

Algorithm = Literal["sft", "grpo", "dpo"]
ALGORITHMS: tuple[Algorithm, ...] = ("sft", "grpo", "dpo")
Device = Literal["auto", "cpu", "cuda"]
LrScheduler = Literal["cosine", "linear", "constant"]
SftBatching = Literal["random", "length_grouped"]
Launcher = Literal["inprocess", "subprocess", "accelerate"]
GrpoRollout = Literal["auto", "tool_loop", "multi_turn"]
GrpoVllm = Literal["off", "colocate", "server"]

# Attention and MLP projections of Qwen2 (and of most Llama-style decoders).
QWEN2_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraSettings(BaseModel):
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


class SftConfig(Section):
    """``training.sft``: which rollouts and demonstrations an SFT step trains on, and how."""

    max_per_task: int = Field(
        default=2,
        gt=0,
        description="At most this many successful trajectories per task enter SFT, so easy tasks "
        "with K successes do not crowd out the rest.",
    )
    batching: SftBatching = Field(
        default="length_grouped",
        description="How SFT conversations form batches. random: shuffled, each batch padded to "
        "its longest conversation (a third of a cycle's batch was padding); length_grouped: "
        "shuffled, then each window of 4 batches sorted by length and cut, and the batches "
        "shuffled again, so a batch holds similar lengths but the run still meets every "
        "length throughout (unlike transformers' group_by_length, which puts each window's "
        "longest batch first).",
    )
    min_score: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="A trajectory counts as a success for SFT from this verifier score on.",
    )
    token_ids: bool = Field(
        default=False,
        description="SFT on a successful rollout trains on the token ids the model read and "
        "generated (Trajectory.model_turns), as DPO and GRPO do, instead of the canonical "
        "tokenisation of its messages, which is how the policy re-reads its past turns. Off by "
        "default: on the quickstart (seed 0) it ended at 28.7% held-out against 35.2% off "
        "(docs/benchmarks.md, one seed); SmolLM2 often spells names in tokens the tokenizer "
        "would not choose.",
    )


class DpoConfig(Section):
    """``training.dpo``: the preference pairs of a DPO step and its temperature."""

    beta: float = Field(
        default=0.1,
        gt=0,
        description="DPO temperature: how far the policy may move from the reference (the base "
        "model with the adapter disabled). Larger stays closer.",
    )
    max_pairs_per_task: int = Field(
        default=2, gt=0, description="At most this many (success, failure) pairs per task."
    )
    micro_batch_size: int | None = Field(
        default=2,
        gt=0,
        description="Pairs per forward pass of a DPO step; the step still averages batch_size x "
        "gradient_accumulation_steps pairs by accumulating. Each pair keeps two sequences' "
        "full-vocabulary logits for the backward pass (0.4 GB a copy at 1024 tokens on "
        "SmolLM2's 49k vocabulary); 8 pairs at once were killed at 23 GiB on a 24 GB machine. "
        "Uses the largest divisor of batch_size up to this; None: batch_size pairs at once.",
    )
    loss_type: list[str] = Field(
        default_factory=lambda: ["sigmoid"],
        min_length=1,
        description="TRL's DPO losses, summed: sigmoid is DPO's own; add 'sft' for an SFT term "
        "on the chosen completion (what hard negatives' target step trains with).",
    )
    loss_weights: list[float] | None = Field(
        default=None,
        description="One weight per loss_type entry (None: 1.0 each).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> DpoConfig:
        if self.loss_weights is not None and len(self.loss_weights) != len(self.loss_type):
            raise ValueError(
                f"dpo.loss_weights has {len(self.loss_weights)} weights for "
                f"{len(self.loss_type)} loss types {self.loss_type}: give one per loss type"
            )
        return self


class GrpoConfig(Section):
    """``training.grpo``: groups, clipping, episodes and who generates them in a GRPO step."""

    num_generations: int = Field(
        default=8,
        ge=2,
        description="Group size G: episodes per prompt whose rewards are compared (K = 8 in the paper).",
    )
    prompts_per_step: int = Field(
        default=4,
        gt=0,
        description="Tasks per generation round; the round has prompts_per_step x "
        "num_generations episodes and feeds that many / (batch_size x "
        "gradient_accumulation_steps) optimisation steps. More tasks per round: more groups with "
        "reward spread (a group whose episodes all score the same teaches nothing).",
    )
    beta: float = Field(
        default=0.0,
        ge=0.0,
        description="KL coefficient towards the reference (the base model, adapter disabled). 0 "
        "skips the reference forward pass (TRL's default); the clipped ratio still bounds each update.",
    )
    epsilon: float = Field(
        default=0.2, gt=0, lt=1, description="Lower clip range of the probability ratio."
    )
    epsilon_high: float = Field(
        default=0.28,
        gt=0,
        lt=1,
        description="Upper clip range (DAPO's clip-higher: above epsilon, so rare good tokens can grow).",
    )
    max_completion_length: int = Field(
        default=384,
        gt=0,
        description="Tokens of one episode after the prompt: the model's calls and answers plus the "
        "tool results in between (and, with rollout multi_turn, the later user turns); a "
        "world episode takes 60-400, a BFCL multi-turn one on a small model 1-3k. An episode "
        "that reaches it ends there, unfinished.",
    )
    max_tool_calls: int = Field(
        default=12,
        gt=0,
        description="Most tool-calling replies per episode (tool_loop), or per user turn "
        "(multi_turn, as rollout.max_tool_calls; the episode ends unfinished beyond it).",
    )
    temperature: float = Field(
        default=0.9, gt=0, description="Sampling temperature of GRPO episodes (0.9 in the paper)."
    )
    prompts: Literal["all", "spread"] = Field(
        default="all",
        description="Which tasks GRPO plays. all: the cycle's rolled-out and synthesized tasks. "
        "spread: where the gradient is: first the tasks whose rollouts this cycle both "
        "succeeded and failed (the boundary set), then new tasks without rollouts; tasks "
        "whose rollouts all failed or all succeeded only to fill prompts_per_step.",
    )
    dynamic_sampling: bool = Field(
        default=False,
        description="Drop the groups whose episodes all succeeded or all failed (binary success) "
        "and refill the round with groups of further tasks (DAPO's dynamic sampling; "
        "training/dynamic_sampling.py). One training process only.",
    )
    demonstration_steps: int = Field(
        default=0,
        ge=0,
        description="Of max_steps, optimisation steps of SFT on the reference solutions of the "
        "tasks whose rollouts this cycle all failed, taken before the GRPO steps: such tasks "
        "get demonstrations instead of groups without reward spread (small models collapse "
        "on those). 0: off.",
    )
    demonstration_learning_rate: float | None = Field(
        default=None,
        gt=0,
        description="Learning rate of those SFT steps (None: learning_rate; GRPO's rate is "
        "often far below what SFT needs).",
    )
    max_refills: int = Field(
        default=2,
        ge=0,
        description="dynamic_sampling: most extra generation rounds per step to refill "
        "dropped groups; the rest of the round is then filled with groups without spread.",
    )
    rollout: GrpoRollout = Field(
        default="auto",
        description="How GRPO plays an episode. tool_loop: TRL's environment_factory loop, "
        "which ends the episode at the first answer without calls (one user turn; tasks with "
        "more are left out) and parses only templates TRL knows (Qwen2.5 <tool_call> JSON). "
        "multi_turn: coevolve's rollout_func (training/multiturn_grpo.py) plays every user "
        "turn, parses replies as the in-process policy does (plain call lines too) and trains "
        "on the generated ids verbatim, tool results and later user turns masked out of the "
        "loss. auto: multi_turn when a task of the step has more than one user turn (BFCL) or "
        "TRL cannot parse the model's calls (SmolLM2's plain-calls template), else tool_loop.",
    )
    max_reply_tokens: int = Field(
        default=96,
        gt=0,
        description="multi_turn: most tokens of one reply, as the in-process policy's "
        "max_new_tokens (96) in rollouts. A reply cut there is parsed as it stands and closed "
        "with the end-of-turn token (masked out of the loss), as a rollout renders it; the "
        "episode goes on. tool_loop ignores it (TRL caps the whole episode only).",
    )
    vllm: GrpoVllm = Field(
        default="off",
        description="Who generates GRPO episodes. off: the trainer's own model (transformers). "
        "colocate: a vLLM engine on each training GPU, synced with the weights every step (TRL's "
        "vllm_mode colocate; needs the vllm extra and CUDA); the multi-turn rollout works only "
        "here. server: a `trl vllm-serve` process at vllm_server_url (tool_loop only).",
    )
    vllm_gpu_memory_utilization: float = Field(
        default=0.3,
        gt=0,
        lt=1,
        description="vllm colocate: share of the GPU's memory vLLM reserves beside the "
        "training model (TRL's vllm_gpu_memory_utilization).",
    )
    vllm_server_url: str | None = Field(
        default=None,
        description="vllm server: base URL of the `trl vllm-serve` process, e.g. "
        "http://127.0.0.1:8000.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> GrpoConfig:
        problems = []
        if self.epsilon_high < self.epsilon:
            problems.append(
                f"grpo.epsilon_high ({self.epsilon_high}) is below grpo.epsilon ({self.epsilon}); "
                "set grpo.epsilon_high >= grpo.epsilon (equal: symmetric clipping)"
            )
        if self.vllm == "server" and self.vllm_server_url is None:
            problems.append(
                "grpo.vllm 'server' needs grpo.vllm_server_url (where `trl vllm-serve` listens)"
            )
        if self.vllm == "server" and self.rollout == "multi_turn":
            problems.append(
                "the multi-turn rollout generates with vLLM only colocated (every process "
                "would have to call the server together); set grpo.vllm: colocate"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class TrainingConfig(Section):
    """How one cycle trains its LoRA adapter (TRL SFT, DPO or GRPO): what every algorithm
    shares here, each algorithm's own knobs in its section (``sft``, ``dpo``, ``grpo``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    # The flat keys of earlier releases, e.g. grpo_beta: grpo.beta (one release, with a warning).
    renamed: ClassVar[dict[str, str]] = {
        "sft_max_per_task": "sft.max_per_task",
        "sft_batching": "sft.batching",
        "sft_min_score": "sft.min_score",
        "sft_token_ids": "sft.token_ids",
        "dpo_beta": "dpo.beta",
        "dpo_max_pairs_per_task": "dpo.max_pairs_per_task",
        "dpo_micro_batch_size": "dpo.micro_batch_size",
        "grpo_num_generations": "grpo.num_generations",
        "grpo_prompts_per_step": "grpo.prompts_per_step",
        "grpo_beta": "grpo.beta",
        "grpo_epsilon": "grpo.epsilon",
        "grpo_epsilon_high": "grpo.epsilon_high",
        "grpo_max_completion_length": "grpo.max_completion_length",
        "grpo_max_tool_calls": "grpo.max_tool_calls",
        "grpo_temperature": "grpo.temperature",
        "grpo_prompts": "grpo.prompts",
        "grpo_dynamic_sampling": "grpo.dynamic_sampling",
        "grpo_demonstration_steps": "grpo.demonstration_steps",
        "grpo_demonstration_learning_rate": "grpo.demonstration_learning_rate",
        "grpo_max_refills": "grpo.max_refills",
        "grpo_rollout": "grpo.rollout",
        "grpo_max_reply_tokens": "grpo.max_reply_tokens",
        "grpo_vllm": "grpo.vllm",
        "grpo_vllm_gpu_memory_utilization": "grpo.vllm_gpu_memory_utilization",
        "grpo_vllm_server_url": "grpo.vllm_server_url",
    }

    algorithm: Algorithm = Field(
        default="sft",
        description="sft: rejection-sampling fine-tuning on verified successes and reference "
        "demonstrations; dpo: preference optimisation on (success, failure) pairs of the same task; "
        "grpo: group-relative policy optimisation with the environment's verifier as reward.",
    )
    lora: LoraSettings = Field(default_factory=LoraSettings, description="Shape of a new adapter.")
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
    # ------------------------------------------------------------------ seal
    seal: SealSettings = Field(
        default_factory=SealSettings,
        description="SEAL: diagnosis-guided GRPO advantage weights and the training-only "
        "interface of GRPO episodes; all off by default (coevolve.training.seal).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainingConfig:
        problems = []
        if self.algorithm == "grpo" and self.grpo.demonstration_steps >= self.max_steps:
            problems.append(
                f"grpo.demonstration_steps ({self.grpo.demonstration_steps}) leaves no GRPO step "
                f"of max_steps ({self.max_steps}): lower it or raise max_steps"
            )
        if self.grpo.dynamic_sampling and self.launcher == "accelerate":
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
        if self.algorithm == "grpo":
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
        if self.grpo.vllm != "off" and self.algorithm != "grpo":
            problems.append(
                f"grpo.vllm is {self.grpo.vllm!r} but algorithm is {self.algorithm!r}; vLLM "
                "generates GRPO episodes only: set algorithm: grpo or grpo.vllm: off"
            )
        if self.grpo.vllm != "off" and self.device == "cpu":
            problems.append(
                "grpo.vllm needs a GPU but device is 'cpu'; set grpo.vllm: off on a CPU"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self
