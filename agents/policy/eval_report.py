"""Evaluation: success overall and per family, with the diagnostics beside it.

Whole-episode success on a few hundred tasks is noisy and dominated by small
copy errors, so the report also gives tool-sequence accuracy (the right tools
in the right order) and per-call accuracy (reference calls matched exactly,
position by position). Episodes the endpoint gave no reply for are counted apart
(``left_out``) and in no rate. Beside them: how the calls that were read were written
(``calls_by_form``: the server's tool_calls field, <tool_call> tags, bare or fenced JSON,
call lines), how many replies looked like a call and could not be read
(``unreadable_calls``), and every failed call by its error kind (``call_errors``, summed in
``failed_calls``; a call past the time limit is kind ``timeout``), so a model whose calls go
unread shows it, instead of ending every episode on a "final answer". ``observations_cut``
counts the observations the agent saw cut to ``env.max_observation_chars``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from pydantic import BaseModel, Field

from ...envs.parsing import UNREADABLE_CALL
from ...records import CALL_FORMS, Task, Trajectory, is_success, split_transport_failures
from .conversation import observations_cut
from .policy_interface import EndpointUnreachable


class GroupStats(BaseModel):
    episodes: int = 0
    successes: int = 0
    mean_score: float = 0.0
    tool_sequence_accuracy: float = 0.0
    call_accuracy: float = 0.0
    errors: int = Field(
        default=0,
        description="Episodes that ended on a policy error (endpoint down, a reply cut by a "
        "token budget, ...); failed tool calls are ``failed_calls``.",
    )
    cut_off: int = Field(default=0, description="Episodes stopped by the step limit.")
    left_out: int = Field(
        default=0,
        description="Episodes the endpoint gave no usable reply for (connection, timeout, "
        "5xx or unreadable body after every retry): not in ``episodes`` nor any rate.",
    )
    calls_by_form: dict[str, int] = Field(
        default_factory=lambda: {str(form): 0 for form in CALL_FORMS},
        description="Calls read, by how the model wrote them (records.CALL_FORMS); calls "
        "handed over without a reply to read (the oracle's) are in none.",
    )
    unreadable_calls: int = Field(
        default=0,
        description="Replies (or parts of one) that looked like a tool call in no form the "
        "policy reads (error kind unreadable_call): failed calls, not answers.",
    )
    call_errors: dict[str, int] = Field(
        default_factory=dict,
        description="Failed calls by error kind (unknown_tool, bad_arguments, "
        "unreadable_call, not_found, timeout, ...), most frequent first.",
    )
    failed_calls: int = Field(
        default=0, description="Failed tool calls, every kind: the sum of ``call_errors``."
    )
    observations_cut: int = Field(
        default=0,
        description="Observations the agent saw cut to env.max_observation_chars (the steps "
        "keep them whole).",
    )

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


class EvalReport(BaseModel):
    env: str
    scope: dict[str, str]
    policy: str
    overall: GroupStats
    by_family: dict[str, GroupStats]

    def as_json(self) -> dict:
        def flat(stats: GroupStats) -> dict:
            return {**stats.model_dump(), "success_rate": round(stats.success_rate, 4)}

        return {
            "env": self.env,
            **self.scope,
            "policy": self.policy,
            "overall": flat(self.overall),
            "by_family": {family: flat(stats) for family, stats in self.by_family.items()},
        }


def split_label(split: str) -> str:
    """How lines, tables and figures name an evaluated split: held-out, or the split's own
    name (validation, when tuning)."""
    return "held-out" if split == "heldout" else split


def left_out_note(left_out: int) -> str:
    """What a line that counts episodes adds for those the endpoint gave no reply for."""
    if not left_out:
        return ""
    return f", {left_out} left out (no reply from the endpoint)"


def stop_if_unreachable(trajectories: Sequence[Trajectory], max_share: float, stage: str) -> None:
    """Raise ``EndpointUnreachable`` when the endpoint gave no usable reply to more than
    ``max_share`` of a stage's episodes, or to all of them: learning from those episodes
    would teach the loop failures that are not the agent's. Raised before the stage writes
    anything, so a resume runs the stage again, as if the server had never gone."""
    ran, lost = split_transport_failures(trajectories)
    if not lost or (ran and len(lost) <= max_share * len(trajectories)):
        return
    cause, _ = Counter(t.error or "no reply" for t in lost).most_common(1)[0]
    share = (
        "none got a usable reply"
        if not ran
        else f"{len(lost)} got no usable reply (more than rollout.max_unreachable_share, "
        f"{max_share:.0%})"
    )
    raise EndpointUnreachable(f"{stage}: of {len(trajectories)} episodes {share}; {cause}")


def _group(trajectories: Sequence[Trajectory], tasks: dict[str, Task]) -> GroupStats:
    trajectories, lost = split_transport_failures(trajectories)
    stats = GroupStats(episodes=len(trajectories), left_out=len(lost))
    if not trajectories:
        return stats
    sequence_hits = call_hits = call_total = 0
    stats.mean_score = sum(t.score for t in trajectories) / len(trajectories)
    errors: Counter[str] = Counter()
    for trajectory in trajectories:
        for step in trajectory.steps:
            if step.call is not None and step.call_form is not None:
                stats.calls_by_form[step.call_form] += 1
            if step.observation.error is not None:
                errors[step.observation.error] += 1
        stats.observations_cut += observations_cut(trajectory)
        stats.successes += is_success(trajectory.score)
        stats.errors += trajectory.error is not None
        stats.cut_off += not trajectory.finished and trajectory.error is None
        reference = tasks[trajectory.task_id].reference_calls if trajectory.task_id in tasks else []
        made = trajectory.calls
        sequence_hits += [c.name for c in made] == [c.name for c in reference]
        call_total += len(reference)
        call_hits += sum(
            m.name == r.name and m.arguments == r.arguments
            for m, r in zip(made, reference, strict=False)
        )
    stats.unreadable_calls = errors[UNREADABLE_CALL]
    stats.call_errors = dict(sorted(errors.items(), key=lambda item: (-item[1], item[0])))
    stats.failed_calls = sum(errors.values())
    stats.tool_sequence_accuracy = sequence_hits / len(trajectories)
    stats.call_accuracy = call_hits / call_total if call_total else 0.0
    return stats


def evaluation_report(
    trajectories: Sequence[Trajectory],
    tasks: Sequence[Task],
    env: str,
    scope: dict[str, str],
    policy: str,
) -> EvalReport:
    by_id = {task.id: task for task in tasks}
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.family].append(trajectory)
    return EvalReport(
        env=env,
        scope=scope,
        policy=policy,
        overall=_group(trajectories, by_id),
        by_family={family: _group(group, by_id) for family, group in sorted(groups.items())},
    )
