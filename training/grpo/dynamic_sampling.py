"""GRPO groups with reward spread: dynamic sampling (DAPO) on TRL's GRPOTrainer.

A group is the ``num_generations`` episodes of one prompt. When every episode of
a group succeeds, or every one fails, the group's advantages are all 0 and the
step learns nothing from it; at 20% success most groups of a small model are
all-fail (75% of the quickstart's GRPO groups had no spread). Dynamic sampling
drops such groups and refills the generation batch with groups of further
prompts, drawn from the training rows not in the batch, for up to ``max_refills``
more generation rounds; what is still missing after that is taken from the
dropped groups (they add no gradient, as before). Spread is decided on *binary
success* (``records.is_success`` of the verifier's score), never on a shaped
reward: a shaped score lets all-fail groups through (a verl recipe lost its
policy that way).

The merged batch is what TRL's own generation returns, with prompts padded on
the left and completions on the right to the longest of the rounds. Every
generation batch logs ``dynamic/groups_with_spread`` (share of the first
round's groups), ``dynamic/dropped`` and ``dynamic/refilled`` (groups) and
``dynamic/final_with_spread`` (share of the trained groups). One process only:
the groups of a batch are split over processes, and refilling one process's
share would break the others'.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from functools import cache
from itertools import accumulate
from typing import Any

from ...records import Task, is_success

# Keys of TRL 1.16's generation output that are per completion and padded on the right.
_COMPLETION_KEYS = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "sampling_per_token_logps",
    "ref_per_token_logps",
    "importance_sampling_ratio",
    "tool_mask",
)
_PROMPT_KEYS = ("prompt_ids", "prompt_mask")


def has_spread(successes: Sequence[bool]) -> bool:
    """Whether a group's episodes both succeeded and failed: where GRPO has gradient."""
    return any(successes) and not all(successes)


def spread_chance(success_rate: float, group_size: int) -> float:
    """The chance that ``group_size`` episodes at ``success_rate`` both succeed and fail."""
    return 1.0 - success_rate**group_size - (1.0 - success_rate) ** group_size


# How many rollouts' worth of weight a family's rate gets beside a task's own rollouts.
FAMILY_PRIOR_WEIGHT = 2.0


def success_rates(
    tasks: Sequence[Task], outcomes: Mapping[str, Sequence[bool]], families: Mapping[str, str]
) -> dict[str, float]:
    """Each task's success rate as this cycle's rollouts estimate it: its own outcomes,
    weighed with its family's rate (a task without rollouts, synthesized this cycle, gets
    its family's: variants keep their parent's family), and for a family without rollouts
    the cycle's rate. ``outcomes``: task id -> binary success of each rollout;
    ``families``: task id -> family of the rolled-out tasks."""
    by_family: dict[str, list[bool]] = {}
    for task_id, seen in outcomes.items():
        by_family.setdefault(families[task_id], []).extend(seen)
    everything = [success for seen in outcomes.values() for success in seen]
    overall = sum(everything) / len(everything) if everything else 0.5
    family_rate = {family: sum(seen) / len(seen) for family, seen in by_family.items()}
    rates = {}
    for task in tasks:
        prior = family_rate.get(task.family, overall)
        seen = outcomes.get(task.id, ())
        rates[task.id] = (sum(seen) + FAMILY_PRIOR_WEIGHT * prior) / (
            len(seen) + FAMILY_PRIOR_WEIGHT
        )
    return rates


def groups_with_spread(successes: Sequence[bool], group_size: int) -> list[bool]:
    """Per group of ``group_size`` consecutive episodes: whether both outcomes occur."""
    groups = [successes[i : i + group_size] for i in range(0, len(successes), group_size)]
    return [has_spread(group) for group in groups]


def merge_generation_outputs(outputs: Sequence[dict[str, Any]], pad_id: int) -> dict[str, Any]:
    """One generation output from several (rows concatenated, padded to a common length)."""
    import torch

    def padded(tensors: list[Any], value: float, left: bool) -> Any:
        longest = max(t.shape[1] for t in tensors)
        rows = []
        for tensor in tensors:
            missing = longest - tensor.shape[1]
            pad = (missing, 0) if left else (0, missing)
            rows.append(torch.nn.functional.pad(tensor, pad, value=value))
        return torch.cat(rows, dim=0)

    merged: dict[str, Any] = {}
    for key in outputs[0]:
        values = [output[key] for output in outputs]
        if key in _PROMPT_KEYS:
            merged[key] = padded(values, pad_id if key == "prompt_ids" else 0, left=True)
        elif key in _COMPLETION_KEYS and values[0].dim() == 2:
            merged[key] = padded(values, pad_id if key == "completion_ids" else 0, left=False)
        elif key == "num_items_in_batch":
            merged[key] = sum(values)
        elif hasattr(values[0], "dim") and values[0].dim() >= 1:
            merged[key] = torch.cat(values, dim=0)
        else:
            raise ValueError(f"cannot merge GRPO generation output {key!r} of several rounds")
    return merged


def select_rows(output: dict[str, Any], rows: Sequence[int]) -> dict[str, Any]:
    """The output restricted to completion rows ``rows`` (in that order)."""
    import torch

    index = torch.tensor(list(rows), dtype=torch.long)
    selected: dict[str, Any] = {}
    for key, value in output.items():
        if key == "num_items_in_batch":
            selected[key] = output["completion_mask"][index].sum()
        elif hasattr(value, "dim") and value.dim() >= 1:
            selected[key] = value[index.to(value.device)]
        else:
            selected[key] = value
    return selected


@cache
def dynamic_sampling_trainer_class(base: type) -> type:
    """``base`` (a GRPOTrainer class) with dynamic sampling while training."""

    class DynamicSamplingTrainer(base):
        def __init__(self, *args: Any, max_refills: int = 2, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.max_refills = max_refills
            self._refill_rng = random.Random(self.args.seed)

        def _successes(self, count: int) -> list[bool]:
            """Binary success of the last generation round's ``count`` episodes."""
            if self.environments:
                scores = [environment._score for environment in self.environments[:count]]
            else:
                episodes = getattr(self.rollout_func, "last_episodes", None) or []
                scores = [episode.score for episode in episodes][:count]
            if len(scores) != count:
                raise RuntimeError(
                    f"dynamic sampling read {len(scores)} episode outcomes for {count} episodes"
                )
            return [is_success(score or 0.0) for score in scores]

        def _refill_rows(self, inputs: list[dict[str, Any]], groups: int) -> list[dict[str, Any]]:
            size = self.num_generations
            seen = {repr(row.get("task", row.get("prompt"))) for row in inputs}
            dataset = self.train_dataset
            fresh = [
                i
                for i in range(len(dataset))
                if repr(dataset[i].get("task", dataset[i].get("prompt"))) not in seen
            ]
            if not fresh:
                fresh = list(range(len(dataset)))
            chosen = [self._refill_rng.choice(fresh) for _ in range(groups)]
            return [dict(dataset[i]) for i in chosen for _ in range(size)]

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            if self.model is None or not self.model.training or self.accelerator.num_processes > 1:
                return super()._generate_and_score_completions(inputs)
            size = self.num_generations
            wanted = len(inputs) // size
            output = super()._generate_and_score_completions(inputs)
            spread = groups_with_spread(self._successes(len(inputs)), size)
            metrics = self._metrics["train"]
            metrics["dynamic/groups_with_spread"].append(sum(spread) / max(len(spread), 1))
            rounds = [output]
            kept: list[tuple[int, int]] = []  # (round, group) with spread
            spare: list[tuple[int, int]] = []
            round_spread = spread
            refilled = 0
            for refill in range(self.max_refills + 1):
                for group, has_spread in enumerate(round_spread):
                    (kept if has_spread else spare).append((refill, group))
                missing = wanted - len(kept)
                if missing <= 0 or refill == self.max_refills:
                    break
                rows = self._refill_rows(inputs, missing)
                refilled += missing
                rounds.append(super()._generate_and_score_completions(rows))
                round_spread = groups_with_spread(self._successes(len(rows)), size)
            chosen = (kept + spare)[:wanted]
            metrics["dynamic/dropped"].append(float(len(spread) - sum(spread)))
            metrics["dynamic/refilled"].append(float(refilled))
            metrics["dynamic/final_with_spread"].append(min(len(kept), wanted) / max(wanted, 1))
            if len(rounds) == 1 and chosen == [(0, g) for g in range(wanted)]:
                return output
            pad_id = self.processing_class.pad_token_id or 0
            merged = merge_generation_outputs(rounds, pad_id)
            offsets = [0, *accumulate(r["completion_ids"].shape[0] for r in rounds[:-1])]
            selected = [
                offsets[round_index] + group * size + k
                for round_index, group in chosen
                for k in range(size)
            ]
            return select_rows(merged, selected)

    return DynamicSamplingTrainer
