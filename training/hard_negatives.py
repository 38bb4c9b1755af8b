"""Co-Evolving Agents (arXiv 2511.22254): a failure agent that makes near-success hard negatives.

Two LoRA adapters on one base model:

- the **target** agent, the one evaluated and released, trains by DPO + SFT on
  (expert, failure) pairs of a task: the expert is the task's reference solution
  replayed and verified (or, when it does not verify, a verified success of the
  cycle); the failure is one of the target's own failures or one of the failure
  agent's (``HardNegativeSettings.failure_share`` sets the mix), highest graded
  progress first;
- the **failure** agent rolls out on the same tasks and trains by plain DPO on
  (failure, failure) pairs of a task drawn from both agents' rollouts: the
  higher-progress failure is chosen, ties are dropped, and a success is never
  on either side. It drifts toward failures that come close to success: hard
  negatives.

Failures are ranked by the environment's graded progress (``env.progress()``:
achieved expected state changes on the world, passed turns / scorable turns on
BFCL), never by the binary score, which would make every failure pair a tie. A
hard negative is a failure whose progress is at least ``hard_threshold``;
``hard_negative_share`` measures how many failures are hard, per agent.

The target's objective is TRL's ``DPOConfig(loss_type=["sigmoid", "sft"],
loss_weights=[1.0, sft_weight])``. TRL's ``"sft"`` term is the mean negative
log-likelihood per chosen *token* (IPR's is a sum over the sequence), so a
weight from IPR does not carry over: at equal weight TRL's term is smaller by
the chosen side's token count.

``AdapterSwitch`` lets an in-process ``LocalPolicy`` generate with the failure
adapter and switch back, with peft (``load_adapter`` / ``set_adapter``) on the
base model already in memory. The cycle step that ties these together is
``coevolve.graph.hard_negatives``; docs/hard-negatives.md has the whole picture.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import warnings
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..agents.conversation import reference_conversation
from ..agents.policy import Message
from ..records import Task, Trajectory
from .config import TrainingConfig
from .datasets import PreferencePair, json_arguments, split_opening
from .trainers import TrainResult

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from ..envs.base import Environment
    from ..tracking import TrainTracking

logger = logging.getLogger(__name__)

Agent = Literal["target", "failure"]
SUCCESS = 1.0  # a failure is any episode scoring below this (the paper's reward < 1)
OBJECTIVE_FILE = "objective.json"


class HardNegativeError(RuntimeError):
    """The hard-negative step cannot run as configured; the message says what to change."""


# --------------------------------------------------------------------------- configuration


class HardNegativeSettings(BaseModel):
    """Co-Evolving Agents: a failure agent beside the target, and the target trained on
    (expert, hard negative) pairs with DPO + SFT. Off by default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(
        default=False,
        description="Replace the cycle's training step (training.algorithm) by the target's "
        "DPO + SFT step on (expert, failure) pairs, with a failure agent when failure_agent is on.",
    )
    hard_threshold: float = Field(
        default=0.6,
        gt=0.0,
        lt=1.0,
        description="A failure whose graded progress is at least this is a hard negative (0.6 is "
        "the paper's analysis threshold). Used for the shares recorded per cycle.",
    )
    # ------------------------------------------------------------------ the failure agent
    failure_agent: bool = Field(
        default=True,
        description="Roll out and train a failure agent (a second LoRA adapter on the same base). "
        "Off: the target learns from its own failures only (the own-negatives arm).",
    )
    failure_rollouts: int | None = Field(
        default=None,
        gt=0,
        description="Episodes per task for the failure agent (None: rollout.k, as the target).",
    )
    failure_temperature: float | None = Field(
        default=None,
        ge=0.0,
        description="Sampling temperature of the failure agent's episodes (None: rollout.temperature).",
    )
    failure_pairs_per_task: int = Field(
        default=4,
        gt=0,
        description="At most this many (failure, failure) pairs per task for the failure agent; "
        "pairs with the highest-progress chosen side come first.",
    )
    failure_beta: float = Field(
        default=0.1,
        gt=0.0,
        description="DPO beta of the failure agent (ETO's first iteration: 0.1).",
    )
    failure_learning_rate: float | None = Field(
        default=None,
        gt=0.0,
        description="Learning rate of the failure agent (None: training.learning_rate).",
    )
    failure_max_steps: int | None = Field(
        default=None,
        gt=0,
        description="Optimisation steps of the failure agent per cycle (None: training.max_steps).",
    )
    freeze_failure_after: int | None = Field(
        default=None,
        gt=0,
        description="Stop training the failure agent after this cycle (the paper's 'w/o "
        "co-evolution' ablation freezes it after cycle 1); None: it trains every cycle.",
    )
    # ------------------------------------------------------------------ the target
    beta: float = Field(
        default=0.1,
        gt=0.0,
        description="DPO beta of the target's objective (ETO and IPR: 0.1).",
    )
    sft_weight: float = Field(
        default=1.0,
        ge=0.0,
        description="lambda: weight of TRL's 'sft' term (mean NLL per chosen token) beside the "
        "sigmoid DPO term (weight 1). Not IPR's lambda: IPR sums the NLL over tokens.",
    )
    pairs_per_task: int = Field(
        default=4,
        gt=0,
        description="At most this many (expert, failure) pairs per task for the target.",
    )
    failure_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Share of each task's target pairs whose rejected side is a failure-agent "
        "failure; the rest are the target's own. 0: own failures only; when one side has too "
        "few failures the other fills in, unless the share is exactly 0 or 1.",
    )
    min_negative_progress: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Only failures with at least this graded progress are the target's negatives "
        "(0: every failure, hardest first; hard_threshold: hard negatives only).",
    )
    truncate_extra_turns: int | None = Field(
        default=5,
        ge=0,
        description="Cut a rejected conversation to the expert's length plus this many "
        "(assistant, tool) turns, as ETO does; None: never cut.",
    )
    learning_rate: float | None = Field(
        default=None,
        gt=0.0,
        description="Learning rate of the target (None: training.learning_rate).",
    )
    max_steps: int | None = Field(
        default=None,
        gt=0,
        description="Optimisation steps of the target per cycle (None: training.max_steps).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> HardNegativeSettings:
        problems = []
        if not self.failure_agent and self.failure_share > 0:
            problems.append(
                f"failure_share is {self.failure_share} but failure_agent is off, so there are "
                "no failure-agent negatives; set failure_share: 0 (own negatives only) or "
                "failure_agent: true"
            )
        if not self.failure_agent and self.freeze_failure_after is not None:
            problems.append(
                "freeze_failure_after needs a failure agent; set failure_agent: true or remove "
                "freeze_failure_after"
            )
        if not self.failure_agent:
            unused = [
                name
                for name in (
                    "failure_rollouts",
                    "failure_temperature",
                    "failure_learning_rate",
                    "failure_max_steps",
                )
                if getattr(self, name) is not None
            ]
            if unused:
                problems.append(
                    f"{', '.join(unused)} set but failure_agent is off, so they do nothing; "
                    "remove them or set failure_agent: true"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def target_config(self, training: TrainingConfig) -> TrainingConfig:
        """The training settings of the target's DPO + SFT step."""
        return training.model_copy(
            update={
                "algorithm": "dpo",
                "dpo_beta": self.beta,
                "learning_rate": self.learning_rate or training.learning_rate,
                "max_steps": self.max_steps or training.max_steps,
            }
        )

    def failure_config(self, training: TrainingConfig) -> TrainingConfig:
        """The training settings of the failure agent's DPO step."""
        return training.model_copy(
            update={
                "algorithm": "dpo",
                "dpo_beta": self.failure_beta,
                "learning_rate": self.failure_learning_rate or training.learning_rate,
                "max_steps": self.failure_max_steps or training.max_steps,
            }
        )

    def trains_failure_agent(self, cycle: int) -> bool:
        return self.failure_agent and (
            self.freeze_failure_after is None or cycle <= self.freeze_failure_after
        )


# --------------------------------------------------------------------------- graded ranking


def with_progress(
    trajectories: Sequence[Trajectory], tasks: Mapping[str, Task]
) -> list[Trajectory]:
    """The trajectories with ``progress`` filled in where it is missing (from the task's
    environment: ``coevolve.envs.diagnosis``). One whose task is unknown, or whose
    environment has no graded progress, keeps None and is never ranked."""
    from ..envs.diagnosis import diagnose_trajectory

    out = []
    for trajectory in trajectories:
        task = tasks.get(trajectory.task_id)
        if trajectory.progress is not None or task is None or task.env not in ("world", "bfcl"):
            out.append(trajectory)
            continue
        try:
            _, progress = diagnose_trajectory(task, trajectory)
        except Exception as err:  # one odd trajectory must not end the cycle
            logger.warning("no progress for %s: %s: %s", trajectory.id, type(err).__name__, err)
            out.append(trajectory)
            continue
        out.append(trajectory.model_copy(update={"progress": min(max(progress, 0.0), 1.0)}))
    return out


def is_failure(trajectory: Trajectory) -> bool:
    """A finished episode below full score, with an assistant turn and a graded progress."""
    if trajectory.score >= SUCCESS or trajectory.progress is None:
        return False
    if trajectory.error is not None:
        return False
    opening, rest = split_opening(trajectory.messages)
    return bool(opening) and any(m.get("role") == "assistant" for m in rest)


def hard_negative_share(trajectories: Sequence[Trajectory], threshold: float) -> dict[str, Any]:
    """How many of the episodes' failures are hard negatives (progress >= ``threshold``).

    ``share`` is hard / failures (None without failures); ``success`` the share of
    episodes that succeeded; ``mean_failure_progress`` the mean progress of the failures.
    """
    failures = [t for t in trajectories if is_failure(t)]
    hard = [t for t in failures if (t.progress or 0.0) >= threshold]
    successes = sum(t.score >= SUCCESS for t in trajectories)
    return {
        "episodes": len(trajectories),
        "success": successes / len(trajectories) if trajectories else None,
        "failures": len(failures),
        "hard": len(hard),
        "share": len(hard) / len(failures) if failures else None,
        "mean_failure_progress": (
            sum(t.progress or 0.0 for t in failures) / len(failures) if failures else None
        ),
    }


class RankedPair(PreferencePair):
    """A preference pair with where its sides came from and their graded progress."""

    chosen_agent: Literal["target", "failure", "expert"]
    rejected_agent: Agent
    chosen_id: str
    rejected_id: str
    chosen_progress: float
    rejected_progress: float
    chosen_score: float
    rejected_score: float
    hard: bool = Field(description="The rejected side (for failure pairs: the chosen) is hard.")


def _distinct_failures(
    tagged: Sequence[tuple[Agent, Trajectory]],
) -> list[tuple[Agent, Trajectory, list[Message], list[Message]]]:
    """(agent, trajectory, opening, rest) of each distinct failure, highest progress first."""
    seen: set[str] = set()
    out = []
    ranked = sorted(tagged, key=lambda item: -(item[1].progress or 0.0))
    for agent, trajectory in ranked:
        if not is_failure(trajectory):
            continue
        messages = json_arguments(trajectory.messages)
        key = json.dumps(messages, sort_keys=True, ensure_ascii=False)
        if key in seen:
            continue
        seen.add(key)
        opening, rest = split_opening(messages)
        out.append((agent, trajectory, opening, rest))
    return out


def _by_task(
    target: Sequence[Trajectory], failure: Sequence[Trajectory]
) -> dict[str, list[tuple[Agent, Trajectory]]]:
    grouped: dict[str, list[tuple[Agent, Trajectory]]] = defaultdict(list)
    for trajectory in target:
        grouped[trajectory.task_id].append(("target", trajectory))
    for trajectory in failure:
        grouped[trajectory.task_id].append(("failure", trajectory))
    return grouped


def failure_pairs(
    target: Sequence[Trajectory],
    failure: Sequence[Trajectory],
    max_per_task: int,
    hard_threshold: float = 0.6,
) -> list[RankedPair]:
    """(failure, failure) pairs of one task for the failure agent's DPO.

    Failures (score < 1, graded progress known, finished without error) of both
    agents are pooled per task; in every pair the chosen side has strictly higher
    progress than the rejected one (ties are dropped), either agent may be on
    either side, and a success is never on either side. Both sides share the
    opening (system prompt and request). Pairs whose chosen side has the highest
    progress come first, then the widest margin; at most ``max_per_task`` per task,
    each failure chosen at most once.
    """
    if max_per_task < 1:
        raise ValueError(f"max_per_task must be >= 1, got {max_per_task}")
    pairs = []
    for task_id, tagged in _by_task(target, failure).items():
        failures = _distinct_failures(tagged)
        candidates = []
        for i, (c_agent, chosen, c_open, c_rest) in enumerate(failures):
            for r_agent, rejected, r_open, r_rest in failures[i + 1 :]:
                c_progress, r_progress = chosen.progress or 0.0, rejected.progress or 0.0
                if c_progress <= r_progress or c_open != r_open:
                    continue
                candidates.append(
                    (-c_progress, -(c_progress - r_progress), i, c_agent, chosen, c_rest, r_agent, rejected, r_rest, c_open)
                )  # fmt: skip
        candidates.sort(key=lambda item: item[:3])
        used: set[str] = set()
        for _, _, _, c_agent, chosen, c_rest, r_agent, rejected, r_rest, opening in candidates:
            if len(used) >= max_per_task:
                break
            if chosen.id in used:
                continue
            used.add(chosen.id)
            pairs.append(
                RankedPair(
                    task_id=task_id,
                    prompt=opening,
                    chosen=c_rest,
                    rejected=r_rest,
                    chosen_agent=c_agent,
                    rejected_agent=r_agent,
                    chosen_id=chosen.id,
                    rejected_id=rejected.id,
                    chosen_progress=chosen.progress or 0.0,
                    rejected_progress=rejected.progress or 0.0,
                    chosen_score=chosen.score,
                    rejected_score=rejected.score,
                    hard=(chosen.progress or 0.0) >= hard_threshold,
                )
            )
    return pairs


def expert_conversations(
    tasks: Sequence[Task],
    make_env: Callable[[], Environment],
    system_prompt: str | None,
    successes: Sequence[Trajectory] = (),
) -> dict[str, list[Message]]:
    """The expert conversation of each task: its reference solution replayed, kept only when
    it verifies; otherwise the shortest verified success among ``successes``."""
    experts: dict[str, list[Message]] = {}
    for task in tasks:
        try:
            messages, score = reference_conversation(make_env(), task, system_prompt)
        except Exception as err:  # a broken reference must not end the cycle
            logger.warning("reference of %s failed: %s: %s", task.id, type(err).__name__, err)
            score = 0.0
        if score >= SUCCESS:
            experts[task.id] = json_arguments(messages)
    for trajectory in sorted(successes, key=lambda t: len(t.messages)):
        if (
            trajectory.task_id not in experts
            and trajectory.score >= SUCCESS
            and trajectory.error is None
            and trajectory.finished
        ):
            experts[trajectory.task_id] = json_arguments(trajectory.messages)
    return experts


def target_pairs(
    experts: Mapping[str, Sequence[Message]],
    target: Sequence[Trajectory],
    failure: Sequence[Trajectory],
    settings: HardNegativeSettings,
) -> list[RankedPair]:
    """(expert, failure) pairs of one task for the target's DPO + SFT.

    Per task, ``round(failure_share * pairs_per_task)`` rejected sides come from
    the failure agent's failures and the rest from the target's own, highest
    graded progress first, only failures with progress >= ``min_negative_progress``;
    when one source runs short the other fills in (unless the share is 0 or 1).
    The expert is always the chosen side. A rejected conversation longer than the
    expert's by more than ``truncate_extra_turns`` (assistant, tool) turns is cut.
    """
    share = settings.failure_share
    pairs = []
    for task_id, tagged in _by_task(target, failure).items():
        expert = experts.get(task_id)
        if expert is None:
            continue
        opening, chosen = split_opening(json_arguments(expert))
        pool: dict[Agent, list[tuple[Trajectory, list[Message]]]] = {"target": [], "failure": []}
        for agent, trajectory, t_open, rest in _distinct_failures(tagged):
            if t_open == opening and (trajectory.progress or 0.0) >= settings.min_negative_progress:
                pool[agent].append((trajectory, rest))
        quota_failure = round(share * settings.pairs_per_task)
        picked: list[tuple[Agent, Trajectory, list[Message]]] = []
        picked += [("failure", t, r) for t, r in pool["failure"][:quota_failure]]
        picked += [
            ("target", t, r) for t, r in pool["target"][: settings.pairs_per_task - len(picked)]
        ]
        if 0.0 < share < 1.0:  # one side ran short: the other fills in
            for agent in ("failure", "target"):
                for t, r in pool[agent]:
                    if len(picked) >= settings.pairs_per_task:
                        break
                    if all(t.id != p[1].id for p in picked):
                        picked.append((agent, t, r))
        for agent, trajectory, rest in picked:
            if settings.truncate_extra_turns is not None:
                rest = rest[: len(chosen) + 2 * settings.truncate_extra_turns]
            pairs.append(
                RankedPair(
                    task_id=task_id,
                    prompt=opening,
                    chosen=chosen,
                    rejected=rest,
                    chosen_agent="expert",
                    rejected_agent=agent,
                    chosen_id=f"{task_id}/expert",
                    rejected_id=trajectory.id,
                    chosen_progress=1.0,
                    rejected_progress=trajectory.progress or 0.0,
                    chosen_score=1.0,
                    rejected_score=trajectory.score,
                    hard=(trajectory.progress or 0.0) >= settings.hard_threshold,
                )
            )
    return pairs


# --------------------------------------------------------------------------- training


class Objective(BaseModel):
    """The TRL DPO loss an adapter was trained with (stored as objective.json beside it)."""

    model_config = ConfigDict(extra="forbid")

    agent: Agent
    loss_type: list[str]
    loss_weights: list[float]
    beta: float
    pairs: int = 0
    hard_pairs: int = 0
    pairs_by_source: dict[str, int] = Field(default_factory=dict)


def target_objective(settings: HardNegativeSettings) -> Objective:
    """DPO + SFT: ``loss_type=["sigmoid", "sft"]``, ``loss_weights=[1.0, sft_weight]``."""
    return Objective(
        agent="target",
        loss_type=["sigmoid", "sft"],
        loss_weights=[1.0, settings.sft_weight],
        beta=settings.beta,
    )


def failure_objective(settings: HardNegativeSettings) -> Objective:
    """Plain sigmoid DPO (the paper shows no SFT term for the failure agent)."""
    return Objective(
        agent="failure", loss_type=["sigmoid"], loss_weights=[1.0], beta=settings.failure_beta
    )


def train_preference_adapter(
    config: TrainingConfig,
    objective: Objective,
    *,
    model_dir: str | Path,
    output_dir: str | Path,
    previous_adapter: str | Path | None,
    pairs: Sequence[PreferencePair],
    progress: bool = True,
    tracking: TrainTracking | None = None,
) -> TrainResult:
    """One adapter trained by TRL's ``DPOTrainer`` with ``objective``'s loss and saved atomically.

    Only the adapter being trained changes: the base model is loaded frozen and
    ``previous_adapter`` (or a new LoRA from ``config.lora``) is the one trainable
    adapter; TRL's reference is a frozen copy of it (its ``"ref"`` adapter) or,
    for a new adapter, the base with the adapter disabled. With no pair that
    renders, nothing is written and the result says why.
    """
    import transformers
    from trl import DPOConfig, DPOTrainer

    from ..tokenization import load_tokenizer
    from .trainers import (
        _model_and_peft,
        _ProgressBars,
        _quiet,
        _run,
        _save_adapter,
        common_arguments,
        dpo_dataset,
        resolve_device,
    )

    output = Path(output_dir)
    previous = str(previous_adapter) if previous_adapter is not None else None

    def skipped(reason: str) -> TrainResult:
        logger.info("%s training skipped: %s", objective.agent, reason)
        return TrainResult(
            algorithm="dpo", adapter_dir=previous, previous_adapter=previous, skipped=reason
        )

    if not pairs:
        return skipped(f"no preference pairs for the {objective.agent} agent")
    device = resolve_device(config)
    warnings.filterwarnings(
        "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
    )
    tokenizer = load_tokenizer(model_dir)
    work = Path(tempfile.mkdtemp(prefix=f"coevolve-{objective.agent}-"))
    bars = _ProgressBars(progress)
    try:
        dataset = dpo_dataset(tokenizer, pairs)
        if dataset is None:
            return skipped("no preference pair renders as prompt + completion")
        args = DPOConfig(
            **common_arguments(config, device, work, progress, tracking),
            beta=objective.beta,
            loss_type=list(objective.loss_type),
            loss_weights=list(objective.loss_weights),
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
        _quiet(trainer, progress)
        if tracking is not None:
            tracking.attach(trainer)
        steps, final_loss, mean_loss, elapsed, _ = _run(trainer)
        result = TrainResult(
            algorithm="dpo",
            adapter_dir=str(output),
            previous_adapter=previous,
            steps=steps,
            examples=len(dataset),
            final_loss=final_loss,
            mean_loss=mean_loss,
            train_time_s=round(elapsed, 3),
            steps_per_s=round(steps / elapsed, 3) if elapsed > 0 else None,
            device=device,
        )
        _save_adapter(trainer.model, output, result, config)
        (output / OBJECTIVE_FILE).write_text(objective.model_dump_json(indent=2) + "\n")
        return result
    finally:
        bars.restore()
        shutil.rmtree(work, ignore_errors=True)


def load_objective(adapter_dir: str | Path) -> Objective | None:
    """The objective stored beside an adapter trained here (None for other adapters)."""
    path = Path(adapter_dir) / OBJECTIVE_FILE
    return Objective.model_validate_json(path.read_text()) if path.exists() else None


# --------------------------------------------------------------------------- adapter switching


class AdapterSwitch:
    """Serve a second LoRA adapter from an in-process ``LocalPolicy``'s base model.

    ``with switch.serving(path):`` the policy generates with the adapter at
    ``path`` (None: the bare base model); after the block, with its own adapter
    again. peft adds the second adapter beside the policy's (``load_adapter``)
    and switches with ``set_adapter``; the base model's weights stay the tensors
    already in memory, never reloaded. Merged adapters (``merge_adapter=True``)
    are unmerged before a switch and merged after, and the policy's KV prefix
    cache is cleared on every switch (its keys belong to the other weights).
    """

    NAME = "failure"

    def __init__(self, policy: Any) -> None:
        from ..agents.local_policy import LocalPolicy

        if not isinstance(policy, LocalPolicy):
            raise HardNegativeError(
                f"the failure agent shares the base model of an in-process policy, but the "
                f"policy is {type(policy).__name__}; use policy.kind: local, or set "
                "hard_negatives.failure_agent: false (own negatives only)"
            )
        self.policy = policy

    @contextmanager
    def serving(self, adapter: str | Path | None) -> Iterator[None]:
        policy = self.policy
        own_path = policy.adapter_path
        wanted = Path(adapter).resolve() if adapter is not None else None
        if wanted == (own_path.resolve() if own_path is not None else None):
            yield  # the same weights: nothing to switch
            return
        if adapter is not None and not (Path(adapter) / "adapter_config.json").exists():
            raise HardNegativeError(f"no LoRA adapter at {adapter} (adapter_config.json missing)")
        own_name = policy._adapter_name
        disabled: Any = None
        with policy._lock:
            policy.prefix_cache.clear()
            if own_name is not None and policy.merge_adapter:
                policy.model.unmerge_adapter()
            if adapter is None:  # the failure agent is still the base model
                disabled = policy.model.disable_adapter()
                disabled.__enter__()
            elif own_name is None:  # the target is the base model: wrap it
                from peft import PeftModel

                policy.model = PeftModel.from_pretrained(
                    policy.base_model, str(adapter), adapter_name=self.NAME, is_trainable=False
                )
            else:
                policy.model.load_adapter(str(adapter), adapter_name=self.NAME, is_trainable=False)
                policy.model.set_adapter(self.NAME)
            policy.model.to(policy.device)
            policy.model.eval()
            if adapter is not None and policy.merge_adapter:
                policy.model.merge_adapter()
        try:
            yield
        finally:
            with policy._lock:
                policy.prefix_cache.clear()
                if disabled is not None:
                    disabled.__exit__(None, None, None)
                else:
                    if policy.merge_adapter:
                        policy.model.unmerge_adapter()
                    if own_name is None:
                        policy.base_model = policy.model.unload()
                        policy.base_model.eval()
                        policy.model = policy.base_model
                    else:
                        policy.model.set_adapter(own_name)
                        policy.model.delete_adapter(self.NAME)
                if own_name is not None and policy.merge_adapter:
                    policy.model.merge_adapter()
