"""GRPO's own knobs: ``training.grpo``, as TRL's ``GRPOConfig``.

Every field with its help, and the section rejecting the combinations of its own fields
that cannot work. ``TrainingConfig`` (``training/config.py``) holds what the algorithms
share and checks the combinations across sections.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..common.config_base import Section

GrpoRollout = Literal["auto", "tool_loop", "multi_turn"]
GrpoVllm = Literal["off", "colocate", "server"]


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
        description="KL coefficient towards the reference: the agent the step starts from (TRL "
        "keeps a copy of a loaded adapter as its reference; a first step's is the base model). 0 "
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
    micro_batch_size: int | None = Field(
        default=2,
        gt=0,
        description="Episodes per forward/backward pass of the update; the step still averages "
        "batch_size x gradient_accumulation_steps episodes by accumulating. The update keeps "
        "every episode's full-vocabulary logits (SmolLM2: 49k entries a token): a quickstart "
        "GRPO step of 8 episodes at once peaked at 15.5 GB; 2 at a time, the whole process "
        "peaked at 7.8 GB in one unit and 11.8 GB in another (one thread). Uses the largest "
        "divisor of batch_size up to this; None: batch_size episodes at once.",
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
    learning_rate: float | None = Field(
        default=None,
        gt=0,
        description="Peak learning rate of the GRPO steps (None: training.learning_rate). "
        "training.learning_rate is sized for SFT; on the quickstart no GRPO tuning unit at 5e-4 "
        "ended more than 2 points above the bootstrap agent, and two ended below it "
        "(docs/training.md).",
    )
    disable_dropout: bool = Field(
        default=True,
        description="No LoRA dropout in GRPO's forward passes (TRL's disable_dropout). Episodes "
        "are sampled without dropout, so with it the update's probability ratio starts as "
        "noise instead of 1; on the CPU it also cost 21 s of 157 s of updates per round "
        "(docs/benchmarks.md).",
    )
    prompts: Literal["all", "spread"] = Field(
        default="all",
        description="Which tasks GRPO plays. all: the cycle's rolled-out and synthesized tasks. "
        "spread: where the gradient is: the tasks whose group of num_generations episodes "
        "would more likely than not both succeed and fail, by a success rate estimated from "
        "this cycle's rollouts (a task's own, weighed with its family's; a new task gets its "
        "family's), the likeliest first; the others only to fill prompts_per_step.",
    )
    dynamic_sampling: bool = Field(
        default=False,
        description="Drop the groups whose episodes all succeeded or all failed (binary success) "
        "and refill the round with groups of further tasks (DAPO's dynamic sampling; "
        "training/grpo/dynamic_sampling.py). One training process only.",
    )
    demonstration_steps: int = Field(
        default=0,
        ge=0,
        description="Of max_steps, optimisation steps of SFT on the reference solutions of the "
        "tasks whose rollouts this cycle all failed, taken before the GRPO steps: such tasks "
        "get demonstrations instead of groups without reward spread (small models collapse "
        "on those). 0: off.",
    )
    replay_successes: bool = Field(
        default=False,
        description="demonstration_steps also train on the cycle's verified successes, one per "
        "task (sft.max_per_task), as the SFT arms keep theirs: a task whose episodes all "
        "succeed gives GRPO no gradient, and GRPO steps on other tasks overwrite it (on the "
        "quickstart, GRPO on cancel_event taught the agent to look an event up first, and "
        "create_event fell from 3 of 6 to 0 in each of the four units before this setting).",
    )
    replay_pool: bool = Field(
        default=False,
        description="demonstration_steps also train on the pool's replayed reference solutions "
        "(pool.replay_demonstrations earlier pool tasks a cycle), the same replay the SFT arms "
        "train on: the cycle's successes cover only the tasks rolled out, and on held-out GRPO "
        "still overwrote families it did not play (create_event 83 -> 4%, price_check 100 -> "
        "50% over four seeds).",
    )
    demonstration_order: Literal["first", "last"] = Field(
        default="first",
        description="When the demonstration steps run in a cycle: first (then GRPO starts from "
        "an agent that has seen the all-fail tasks' solutions) or last (they end the cycle, so "
        "the replayed successes repair what the GRPO steps overwrote before the agent is "
        "evaluated and rolled out again).",
    )
    warmup_ratio: float | None = Field(
        default=None,
        ge=0.0,
        lt=1.0,
        description="Warm-up of a GRPO cycle's trainers (its demonstration steps and its GRPO "
        "steps), a fraction of each one's steps (None: training.warmup_ratio). Hugging Face's "
        "warm-up starts at a learning rate of 0 and every cycle starts new trainers, so at the "
        "quickstart's 10 steps a cycle the default 0.05 leaves 2 of them at rate 0.",
    )
    demonstration_learning_rate: float | None = Field(
        default=None,
        gt=0,
        description="Learning rate of those SFT steps (None: training.learning_rate, the SFT "
        "rate; grpo.learning_rate is often far below what SFT needs).",
    )
    replay_coefficient: float = Field(
        default=0.0,
        ge=0.0,
        description="Weight of an SFT term in every GRPO step: the token-mean loss of a "
        "micro-batch of the demonstration steps' conversations (the all-fail tasks' reference "
        "solutions, and what replay_successes / replay_pool add), added to each micro-batch's "
        "GRPO loss, as InstructGPT's PPO-ptx mixes pre-training data into PPO against "
        "regressions (training/grpo/replay_anchor.py). A task whose episodes all succeed gives GRPO "
        "no gradient; on the quickstart's held-out units the GRPO steps then overwrote such "
        "families (create_event 5 -> 0 of 6 in three of four seeds) although the demonstration "
        "steps had just replayed them. 0: off. Needs grpo.demonstration_steps.",
    )
    reference_episodes: bool = Field(
        default=False,
        description="Give a group whose episodes all failed the task's reference episode in "
        "place of its last one, so the group has reward spread and the reference's replies a "
        "positive advantage (ToolExpander; training/grpo/reference_episodes.py). The other way to "
        "feed all-fail tasks is demonstration_steps. Plays with the multi-turn rollout and the "
        "trainer's own generation (grpo.vllm: off).",
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
        "multi_turn: coevolve's rollout_func (training/grpo/multiturn_rollout.py) plays every user "
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
    vllm_tensor_parallel_size: int = Field(
        default=1,
        gt=0,
        description="vllm server: GPUs the `trl vllm-serve` model is split across (its "
        "--tensor-parallel-size; `coevolve serve --grpo` passes it).",
    )
    vllm_data_parallel_size: int = Field(
        default=1,
        gt=0,
        description="vllm server: replicas `trl vllm-serve` runs (its --data-parallel-size).",
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
        if self.reference_episodes and self.rollout == "tool_loop":
            problems.append(
                "grpo.reference_episodes plays references with the multi-turn rollout; set "
                "grpo.rollout: multi_turn or auto"
            )
        if self.reference_episodes and self.vllm != "off":
            problems.append(
                "grpo.reference_episodes needs the trainer's own generation (a reference reply "
                "has no vLLM sampling log-probabilities); set grpo.vllm: off"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self
