"""Co-Evolving Agents (arXiv 2511.22254): a failure agent that makes near-success hard negatives.

Two LoRA adapters on one base model:

- the **target** agent, the one evaluated and released, trains by DPO + SFT on
  (expert, failure) pairs of a task: the expert is the task's reference solution
  replayed and verified (or, when it does not verify, a verified success of the
  cycle); the failure is one of the target's own failures or one of the failure
  agent's (``HardNegativeConfig.failure_share`` sets the mix), highest graded
  progress first;
- the **failure** agent rolls out on the same tasks and trains by plain DPO on
  (failure, failure) pairs of a task drawn from both agents' rollouts: the
  higher-progress failure is chosen, ties are dropped, and a success is never
  on either side. It drifts toward failures that come close to success: hard
  negatives.

Failures are ranked by their failure grade (``Trajectory.failure_grade``:
passed turns / scorable turns on BFCL; on the world the achieved share of the
reference's state changes, answer and calls made in order), never by the binary
score, which would make every failure pair a tie. A hard negative is a failure
whose grade is at least ``hard_threshold``;
``hard_negative_share`` measures how many failures are hard, per agent.

The target's objective is TRL's ``DPOConfig(loss_type=["sigmoid", "sft"],
loss_weights=[1.0, sft_weight])``. TRL's ``"sft"`` term is the mean negative
log-likelihood per chosen *token* (IPR's is a sum over the sequence), so a
weight from IPR does not carry over: at equal weight TRL's term is smaller by
the chosen side's token count.

``AdapterSwitch`` lets an in-process ``LocalPolicy`` generate with the failure
adapter and switch back, with peft (``load_adapter`` / ``set_adapter``) on the
base model already in memory. The cycle step that ties these together is
``coevolve.graph.cycle.hard_negative_step``; docs/hard-negatives.md has the whole picture.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ..config import TrainingConfig
from ..datasets import PreferencePair
from ..trainers import TrainResult
from .pairs import (
    Agent,
    expert_conversations,
    failure_pairs,
    hard_negative_share,
    target_pairs,
    with_failure_grades,
)
from .settings import HardNegativeConfig

if TYPE_CHECKING:  # pragma: no cover
    from ...outputs.tracking import TrainTracking

__all__ = [
    "OBJECTIVE_FILE",
    "AdapterSwitch",
    "Agent",
    "HardNegativeConfig",
    "HardNegativeError",
    "Objective",
    "expert_conversations",
    "failure_objective",
    "failure_pairs",
    "hard_negative_share",
    "load_objective",
    "target_objective",
    "target_pairs",
    "train_preference_adapter",
    "with_failure_grades",
]

logger = logging.getLogger(__name__)

OBJECTIVE_FILE = "objective.json"


class HardNegativeError(RuntimeError):
    """The hard-negative step cannot run as configured; the message says what to change."""


# --------------------------------------------------------------------------- training


class Objective(BaseModel):
    """The TRL DPO loss an adapter was trained with (stored as objective.json beside it)."""

    model_config = ConfigDict(extra="forbid")

    agent: Agent
    loss_type: list[str]
    loss_weights: list[float]
    beta: float | None = Field(
        default=None,
        description="The DPO step's beta (its config's dpo.beta), recorded when it trains.",
    )
    pairs: int = 0
    hard_pairs: int = 0
    pairs_by_source: dict[str, int] = Field(default_factory=dict)


def target_objective(settings: HardNegativeConfig) -> Objective:
    """DPO + SFT: ``loss_type=["sigmoid", "sft"]``, ``loss_weights=[1.0, sft_weight]``
    (beta: the DPO step's, ``HardNegativeConfig.target_config``)."""
    return Objective(
        agent="target", loss_type=["sigmoid", "sft"], loss_weights=[1.0, settings.sft_weight]
    )


def failure_objective(settings: HardNegativeConfig) -> Objective:
    """Plain sigmoid DPO (the paper shows no SFT term for the failure agent; beta: the DPO
    step's, ``HardNegativeConfig.failure_config``)."""
    return Objective(agent="failure", loss_type=["sigmoid"], loss_weights=[1.0])


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
    """One adapter trained by the DPO step (``train_adapter``) with ``objective``'s loss
    and ``config``'s DPO settings (its ``dpo.beta`` is the objective's recorded beta).

    Only the adapter being trained changes: the base model is loaded frozen and
    ``previous_adapter`` (or a new LoRA from ``config.lora``) is the one trainable
    adapter; TRL's reference is a frozen copy of it (its ``"ref"`` adapter) or,
    for a new adapter, the base with the adapter disabled. With no pair that
    renders, nothing is written and the result says why.
    """
    from ..trainers import train_adapter

    if not pairs:
        logger.info("%s training skipped: no preference pairs", objective.agent)
        previous = str(previous_adapter) if previous_adapter is not None else None
        return TrainResult(
            algorithm="dpo",
            adapter_dir=previous,
            previous_adapter=previous,
            skipped=f"no preference pairs for the {objective.agent} agent",
        )
    losses = {
        "loss_type": list(objective.loss_type),
        "loss_weights": list(objective.loss_weights),
    }
    step = config.model_copy(
        update={"algorithm": "dpo", "dpo": config.dpo.model_copy(update=losses)}
    )
    objective = objective.model_copy(update={"beta": step.dpo.beta})
    result = train_adapter(
        step,
        model_dir=model_dir,
        output_dir=output_dir,
        previous_adapter=previous_adapter,
        pairs=pairs,
        progress=progress,
        tracking=tracking,
    )
    if result.skipped is None:
        (Path(output_dir) / OBJECTIVE_FILE).write_text(objective.model_dump_json(indent=2) + "\n")
    return result


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
        from ...agents.policy.local_policy import LocalPolicy

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


@asynccontextmanager
async def failure_agent_policy(
    policy: Any, adapter: str | Path | None, hot_load: str = "required"
) -> AsyncIterator[Any]:
    """The policy the failure agent rolls out with, serving ``adapter`` (None: the base model).

    In process, the target's own ``LocalPolicy`` switches to the adapter
    (``AdapterSwitch``) and back. On an endpoint, a sibling ``EndpointPolicy``
    hot-loads the adapter beside the target's (``<model>-coevolve-failure-cycle-K``;
    vLLM needs ``--max-loras`` of at least 2) and unloads it after the block, so the
    target's adapter stays served throughout. ``hot_load`` is ``policy.hot_load``:
    off cannot serve a failure agent, best_effort rolls out the base model when the
    server lacks the LoRA API (with a warning).
    """
    from ...agents.policy.endpoint_policy import EndpointPolicy
    from ...agents.policy.policy_interface import LoraApiMissing

    if not isinstance(policy, EndpointPolicy):
        with AdapterSwitch(policy).serving(adapter):
            yield policy
        return
    failure = policy.sibling()
    if adapter is not None:
        if hot_load == "off":
            raise HardNegativeError(
                "the failure agent is served as a second LoRA adapter, but policy.hot_load is "
                "off; set policy.hot_load: required, or hard_negatives.failure_agent: false"
            )
        try:
            await failure.serve_adapter(adapter)
        except LoraApiMissing as err:
            if hot_load != "best_effort":
                raise
            logger.warning(
                "could not hot-load the failure agent's adapter %s (%s); it rolls out the "
                "base model (policy.hot_load: best_effort)",
                Path(adapter).resolve(),
                err,
            )
    try:
        yield failure
    finally:
        await failure.unload_adapter()
