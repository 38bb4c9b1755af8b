"""The LLM task-abstractor: exploration rounds -> candidate tasks, asked of a model.

``LLMAbstractor`` asks the abstractor endpoint for tasks (structured output,
``Proposals``) and checks that every proposed action parses; proposals that
repeat the parent or each other are dropped with their reason. It returns an
``Abstraction``, as the offline abstractor (``agents/roles/abstractor.py``) does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, ConfigDict, Field

from ...envs.parsing import ToolCallParseError, parse_tool_calls, render_call
from ...records import CandidateTask, ToolCall
from ..prompts import ABSTRACTOR_PROMPT, fill_environment
from .llm import StructuredOutputError, model_label, structured_call
from .role_interfaces import (
    Abstraction,
    AbstractionInput,
    ExplorationRound,
    RejectedCandidate,
    candidate_setup,
    primary_signal,
)
from .summarizer import clip
from .task_text import actions_key, normalise, repeats

log = logging.getLogger(__name__)


class ProposedTask(BaseModel):
    """One task as the model proposes it (actions are checked after parsing)."""

    model_config = ConfigDict(extra="ignore")

    description: str = Field(description="What the task exercises, in one line.")
    query: str = Field(description="The user's request in natural language.")
    minimal_actions: list[dict[str, Any] | str] = Field(
        description='Tool calls, each {"name": ..., "arguments": {...}} with literal values.'
    )
    reference_answer: str | None = Field(
        default=None, description="Value the final answer must contain, if the query asks one."
    )


class Proposals(BaseModel):
    """The abstractor's reply."""

    model_config = ConfigDict(extra="ignore")

    candidates: list[ProposedTask] = Field(default_factory=list)


def _tool_line(schema: Mapping[str, Any]) -> str:
    function = schema.get("function", schema)
    params = function.get("parameters", {}).get("properties", {}) or {}
    args = ", ".join(params)
    return f"- {function.get('name')}({args}): {function.get('description', '')}"


def render_rounds(rounds: Sequence[ExplorationRound], observation_chars: int = 200) -> str:
    lines: list[str] = []
    for number, exploration in enumerate(rounds, 1):
        lines.append(f"Round {number} (goal: {exploration.objective}):")
        if not exploration.interactions:
            lines.append("  (no calls)")
        for step, interaction in enumerate(exploration.interactions, 1):
            observation = interaction.observation
            text = clip(observation.text, observation_chars)
            tag = f"error[{observation.error}]: " if observation.error else ""
            lines.append(f"  {step}. {render_call(interaction.call)} -> {tag}{text}")
    return "\n".join(lines)


def abstraction_request(
    given: AbstractionInput, tools: Sequence[Mapping[str, Any]], max_candidates: int
) -> str:
    """The user message of the abstractor."""
    task, context = given.task, given.context
    lines = [
        f"Environment: {task.env}",
        f"Flagged task ({', '.join(dict.fromkeys(given.item.kinds))}): {task.instruction}",
        f"Summary: {context.summary}",
        f"Failure cause: {context.failure_cause}",
        f"Focus patterns: {', '.join(context.focus_patterns) or '(none)'}",
        "Exploration objectives:",
        *(f"- {objective}" for objective in context.exploration_objectives),
        "Tools:",
        *(_tool_line(schema) for schema in tools),
        "Exploration rounds (each starts from the same initial state as the flagged task):",
        render_rounds(given.rounds),
        "Do not repeat these tasks:",
        *(f"- {text}" for text in context.do_not_repeat),
        *(f"- {n.text}" for n in given.neighbours),
        f"Propose at most {max_candidates} task(s).",
    ]
    return "\n".join(lines)


class LLMAbstractor:
    """A chat model proposes tasks from the exploration log; each action must parse."""

    reads_exploration = True

    def __init__(
        self,
        model: Any,
        limiter: asyncio.Semaphore | None = None,
        prompt: str = ABSTRACTOR_PROMPT,
        max_candidates: int = 3,
    ):
        if max_candidates < 1:
            raise ValueError("max_candidates must be >= 1")
        self.model = model
        self.limiter = limiter
        self.prompt = fill_environment(prompt, None)  # an open slot never reaches the model
        self.max_candidates = max_candidates
        self.name = f"abstractor:llm({model_label(model)})"

    async def abstract(self, given: AbstractionInput) -> Abstraction:
        env = given.make_env()
        env.reset(given.task)
        request = abstraction_request(given, env.tools(), self.max_candidates)
        messages = [SystemMessage(self.prompt), HumanMessage(request)]
        try:
            reply = await structured_call(self.model, Proposals, messages, self.limiter)
        except StructuredOutputError as err:
            log.warning("abstractor reply unreadable for %s: %s", given.item.trajectory.id, err)
            unreadable = RejectedCandidate(
                description="(the whole reply)", reason=f"abstractor reply unreadable: {err}"
            )
            return Abstraction(rejections=[unreadable])
        setup = candidate_setup(given.rounds[0].setup if given.rounds else given.task.setup)
        chosen: list[CandidateTask] = []
        rejected: list[RejectedCandidate] = []
        seen: set[str] = set()
        for proposal in reply.candidates:
            description = proposal.description or proposal.query
            calls, problem = self._parse_actions(proposal.minimal_actions)
            if problem is None and not proposal.query.strip():
                problem = "the query is empty"
            if problem is None:
                problem = repeats([proposal.query, proposal.description], given)
            key = actions_key(calls)
            if problem is None and (key in seen or normalise(proposal.query) in seen):
                problem = "duplicates another candidate of this item"
            if problem is None and len(chosen) >= self.max_candidates:
                problem = f"over the limit of {self.max_candidates} candidate(s) per item"
            if problem is not None:
                rejected.append(RejectedCandidate(description=description, reason=problem))
                continue
            seen.update({key, normalise(proposal.query)})
            chosen.append(
                CandidateTask(
                    description=description,
                    query=proposal.query.strip(),
                    minimal_actions=calls,
                    reference_answer=proposal.reference_answer or None,
                    parent_task_id=given.task.id,
                    signal=primary_signal(given.item),
                    setup=setup,
                )
            )
        return Abstraction(candidates=chosen, rejections=rejected)

    @staticmethod
    def _parse_actions(actions: Sequence[Any]) -> tuple[list[ToolCall], str | None]:
        if not actions:
            return [], "no minimal actions"
        calls: list[ToolCall] = []
        for number, action in enumerate(actions, 1):
            try:
                parsed = parse_tool_calls(action)
            except ToolCallParseError as err:
                return [], f"action {number} unreadable ({err.kind}): {err}"
            if not parsed:
                return [], f"action {number} holds no tool call"
            calls += [ToolCall(name=c.name, arguments=c.arguments) for c in parsed]
        return calls, None
