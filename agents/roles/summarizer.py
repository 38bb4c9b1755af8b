"""The summarizer: a flagged trajectory -> a signal-conditioned SynthesisContext.

``OfflineSummarizer`` reads the trajectory itself (first failing step, error
observations, tools involved, where it left the reference solution, signal
evidence). ``LLMSummarizer`` asks a model for the same fields from a compact
rendering; if the model's reply cannot be read, it falls back to the offline
reading and says so in the summary, so one bad reply never ends a branch.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage

from ...envs.parsing import render_call
from ...records import (
    FlaggedTrajectory,
    Signal,
    Step,
    SynthesisContext,
    Task,
    ToolCall,
    Trajectory,
    is_success,
)
from ..prompts import SUMMARIZER_PROMPT, fill_environment
from .llm import StructuredOutputError, model_label, structured_call

log = logging.getLogger(__name__)

_OBSERVATION_CHARS = 240


# --------------------------------------------------------------------------- reading a trajectory


def tools_involved(trajectory: Trajectory, task: Task) -> list[str]:
    """Tool names the rollout used, then those of the reference it did not, in order."""
    names = [call.name for call in trajectory.calls] + [c.name for c in task.reference_calls]
    return list(dict.fromkeys(names))


def first_divergence(calls: Sequence[ToolCall], reference: Sequence[ToolCall]) -> str | None:
    """Where the rollout's calls first differ from the reference solution, in words."""
    for number, expected in enumerate(reference, 1):
        if number > len(calls):
            return f"it stopped after {len(calls)} call(s); the reference continues with {render_call(expected)}"
        got = calls[number - 1]
        if got.name != expected.name:
            return f"call {number} was {render_call(got)} where the reference calls {render_call(expected)}"
        if got.arguments != expected.arguments:
            return f"call {number} used {render_call(got)} where the reference has {render_call(expected)}"
    if len(calls) > len(reference):
        return f"it made {len(calls) - len(reference)} call(s) more than the reference, from {render_call(calls[len(reference)])}"
    return None


def failing_step(
    trajectory: Trajectory, reference: Sequence[ToolCall], score_threshold: float = 1.0
) -> int | None:
    """0-based index of the reference call where the rollout went wrong (see SynthesisContext)."""
    if trajectory.score >= score_threshold:
        return None
    steps = trajectory.steps
    for index, expected in enumerate(reference):
        if index >= len(steps):
            return index
        step = steps[index]
        if step.call is None or step.observation.error:
            return index
        if step.call.name != expected.name or step.call.arguments != expected.arguments:
            return index
    return len(reference)


def _evidence_line(signal: Signal) -> str:
    ev = signal.evidence
    match signal.kind:
        case "forgetting":
            window = ev.get("window")
            level, key = ev.get("level", "task"), ev.get("key", signal.task_id)
            return f"forgetting: {level} {key} scored {window} in recent cycles and {ev.get('now')} now"
        case "boundary":
            return f"boundary: this cycle's rollouts of the task scored {ev.get('scores')}"
        case "rare":
            frequency = ev.get("frequency")
            share = f"{frequency:.1%}" if isinstance(frequency, int | float) else "?"
            return f"rare: pattern {ev.get('pattern')!r} seen {ev.get('count')} of {ev.get('total')} times ({share})"
        case "unsolved":
            return f"unsolved: all of this cycle's rollouts failed ({ev.get('scores')}) and no cycle solved it before"
    return f"{signal.kind}: {json.dumps(ev, default=str)}"


def _objective(kind: str, task: Task, tools: Sequence[str], item: FlaggedTrajectory) -> str:
    flow = " > ".join(c.name for c in task.reference_calls) or ", ".join(tools)
    tool_list = ", ".join(tools) or "the task's tools"
    match kind:
        case "forgetting":
            return (
                f"Reinforce the forgotten skill of {task.family}: carry out {flow} again on "
                f"varied people, items and values, copying values from observations into calls."
            )
        case "rare":
            pattern = next(
                (s.evidence.get("pattern") for s in item.signals if s.kind == "rare"), None
            )
            return (
                f"Explore the rare scenario {pattern or flow!r}: reach states where {tool_list} "
                f"are needed, including the errors they can return, and recover from them."
            )
        case "boundary":
            return (
                f"Explore the boundary of {task.family}: variations of {flow} around the step "
                f"where rollouts diverge, with other values and states, some of which fail."
            )
        case "unsolved":
            return (
                f"Build up the unsolved skill of {task.family}: carry out {flow} on fresh people, "
                f"items and values, and its first steps on their own, up to where rollouts fail."
            )
    return f"Explore {tool_list} around the task {task.instruction!r}."


def offline_context(item: FlaggedTrajectory, task: Task) -> SynthesisContext:
    """The environment-grounded reading of a flagged trajectory."""
    trajectory = item.trajectory
    tools = tools_involved(trajectory, task)
    calls = trajectory.calls
    flow = " > ".join(call.name for call in calls) or "no calls"
    kinds = list(dict.fromkeys(item.kinds))
    summary = (
        f"Task {task.id} ({task.family}): {task.instruction!r}. The policy made "
        f"{len(trajectory.steps)} call(s) ({flow}) and scored {trajectory.score:.2f}; "
        f"flagged as {', '.join(kinds) or 'nothing'}."
    )

    causes: list[str] = []
    # The steps whose observation is an error, with their 1-based numbers.
    failed = [(n, step) for n, step in enumerate(trajectory.steps, 1) if step.observation.error]
    if failed:
        number, step = failed[0]
        name = step.call.name if step.call is not None else "unreadable call"
        text = step.observation.text[:_OBSERVATION_CHARS]
        causes.append(f"step {number} ({name}) failed with {step.observation.error}: {text}")
    divergence = first_divergence(calls, task.reference_calls)
    if divergence:
        causes.append(divergence)
    if trajectory.error:
        causes.append(f"the episode stopped early: {trajectory.error}")
    elif not trajectory.finished:
        causes.append("the episode hit the step limit")
    if task.reference_answer is not None and not is_success(trajectory.score):
        causes.append(
            f"the final answer {trajectory.final_answer!r} had to contain {task.reference_answer!r}"
        )
    if not causes:
        causes.append(
            "this rollout did not fail (score 1.00)"
            if is_success(trajectory.score)
            else f"the final state differs from the reference's (score {trajectory.score:.2f})"
        )

    errors = [f"{s.call.name if s.call else '?'}!{s.observation.error}" for _, s in failed]
    patterns = list(tools)
    if calls:
        patterns.append(" > ".join(call.name for call in calls))
    for signal in item.signals:
        if signal.kind == "rare" and signal.evidence.get("pattern"):
            patterns.append(str(signal.evidence["pattern"]))
    instability = "; ".join(_evidence_line(s) for s in item.signals)
    if errors:
        instability += f"; errors seen: {', '.join(errors)}"
    frontier = failing_step(trajectory, task.reference_calls)
    miss = item.nearest_miss
    if miss is not None:
        # The frontier is where the attempt that got furthest broke: aim there.
        miss_step = failing_step(miss, task.reference_calls)
        progress = miss.progress if miss.progress is not None else miss.score
        where = f"broke at reference call {miss_step}" if miss_step is not None else "failed"
        causes.append(
            f"the nearest miss {miss.id} (progress {progress:.2f}) got further and {where}"
        )
        if miss_step is not None and (frontier is None or miss_step > frontier):
            frontier = miss_step
    return SynthesisContext(
        summary=summary,
        failure_cause="; ".join(causes),
        instability_pattern=instability,
        focus_patterns=list(dict.fromkeys(patterns)),
        exploration_objectives=[_objective(kind, task, tools, item) for kind in kinds],
        do_not_repeat=[turn.query for turn in task.turns],
        failing_step=frontier,
    )


class OfflineSummarizer:
    """Reads the trajectory and its signals; no LLM."""

    name = "summarizer:offline"

    async def summarize(self, item: FlaggedTrajectory, task: Task) -> SynthesisContext:
        return offline_context(item, task)


# --------------------------------------------------------------------------- LLM


def clip(text: str, limit: int = _OBSERVATION_CHARS) -> str:
    text = text.replace("\n", " | ")
    return text if len(text) <= limit else text[:limit] + "..."


def _step_line(number: int, step: Step) -> str:
    action = render_call(step.call) if step.call else f"(unreadable) {step.raw or ''}"
    tag = f"error[{step.observation.error}]: " if step.observation.error else ""
    return f"  {number}. {clip(action, 200)} -> {tag}{clip(step.observation.text)}"


def render_flagged(item: FlaggedTrajectory, task: Task) -> str:
    """A compact text rendering of a flagged trajectory for a model to read."""
    trajectory = item.trajectory
    lines = [f"Task {task.id} (env {task.env}, family {task.family})"]
    for number, turn in enumerate(task.turns, 1):
        prefix = "Instruction" if len(task.turns) == 1 else f"User turn {number}"
        lines.append(f"{prefix}: {turn.query}")
    reference = " ; ".join(render_call(call) for call in task.reference_calls)
    lines.append(f"Reference solution: {reference or '(no calls)'}")
    if task.reference_answer is not None:
        lines.append(f"Expected answer contains: {task.reference_answer}")
    status = "finished" if trajectory.finished else "cut off"
    lines.append(
        f"Rollout {trajectory.id} (policy {trajectory.policy_version}, score "
        f"{trajectory.score:.2f}, {status}, {len(trajectory.steps)} steps):"
    )
    lines += [_step_line(number, step) for number, step in enumerate(trajectory.steps, 1)]
    if trajectory.final_answer is not None:
        lines.append(f"Final answer: {clip(trajectory.final_answer)}")
    if trajectory.error:
        lines.append(f"Stopped early: {trajectory.error}")
    lines.append("Signals:")
    for signal in item.signals:
        evidence = json.dumps(signal.evidence, default=str, ensure_ascii=False)
        lines.append(f"  - {signal.kind}: {clip(evidence, 400)}")
    miss = item.nearest_miss
    if miss is not None:
        progress = miss.progress if miss.progress is not None else miss.score
        lines.append(
            f"Nearest miss {miss.id} (same task, failed, progress {progress:.2f}: it got "
            "further; where it broke is the skill's frontier):"
        )
        lines += [_step_line(number, step) for number, step in enumerate(miss.steps, 1)]
    return "\n".join(lines)


class LLMSummarizer:
    """Asks a chat model for the SynthesisContext (structured output)."""

    def __init__(
        self,
        model: Any,
        limiter: asyncio.Semaphore | None = None,
        prompt: str = SUMMARIZER_PROMPT,
    ):
        self.model = model
        self.limiter = limiter
        self.prompt = fill_environment(prompt, None)  # an open slot never reaches the model
        self.name = f"summarizer:llm({model_label(model)})"

    async def summarize(self, item: FlaggedTrajectory, task: Task) -> SynthesisContext:
        messages = [SystemMessage(self.prompt), HumanMessage(render_flagged(item, task))]
        try:
            context = await structured_call(self.model, SynthesisContext, messages, self.limiter)
        except StructuredOutputError as err:
            log.warning("summarizer reply unreadable for %s: %s", item.trajectory.id, err)
            fallback = offline_context(item, task)
            summary = f"[LLM summary unreadable: {clip(str(err), 300)}] {fallback.summary}"
            return fallback.model_copy(update={"summary": summary})
        keep = [turn.query for turn in task.turns if turn.query not in context.do_not_repeat]
        return context.model_copy(update={"do_not_repeat": [*context.do_not_repeat, *keep]})
