"""The task writer: calls that ran, back-translated into the request they carry out.

A user has seed tasks, an environment and models; not a task generator. The writer
(instruction back-translation, as Humpback) is a model taught on the seed tasks to
read a numbered list of tool calls with their results and write the user's request
(and the answer, when the request asks for a value). Its material is what the agent
did:

- hindsight: the flagged trajectory's calls that succeeded, relabelled as the task they
  accomplish (HSL, AgentHER): a failure still demonstrates something;
- explored: each exploration round's calls that succeeded (the explorer is the current
  policy at a high temperature: ``explorer_policy_rounds``).

The calls are the candidate's minimal actions as they ran, so replay (the judge) checks
the writer's answer and the task's outcome, not a model's idea of the environment.
Self-curation keeps a candidate only if its request names every argument value the
calls need that no earlier result shows (``grounding``); every rejection keeps its
reason. Nothing here reads the environment's task generator or any split.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.messages import HumanMessage, SystemMessage

from ...envs.parsing import render_call
from ...records import CandidateTask, Observation, ToolCall
from ..prompts import WRITER_PROMPT
from .abstractor import actions_key, normalise, repeats
from .explorer import mentions
from .llm import model_label
from .replies import ask, raise_unless_one_replied
from .role_interfaces import (
    Abstraction,
    AbstractionInput,
    Interaction,
    RejectedCandidate,
    WriterMaterial,
    candidate_setup,
    primary_signal,
)

# Results longer than this are cut in the writer's input: it needs the values, not pages.
OBSERVATION_CHARS = 160
_REQUEST = re.compile(r"^\s*request\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_ANSWER = re.compile(r"^\s*answer\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_NO_ANSWER = {"", "-", "none", "n/a", "null"}
# One piece of the writer's material: (kind, the setup it ran from, the calls that succeeded).
Segment = tuple[Literal["hindsight", "explored"], dict[str, Any], list[Interaction]]


def render_calls(interactions: Sequence[Interaction]) -> str:
    """The writer's input: the calls, numbered, each with its result on one line."""
    lines = []
    for number, interaction in enumerate(interactions, 1):
        text = " ".join(interaction.observation.text.split())
        if len(text) > OBSERVATION_CHARS:
            text = text[:OBSERVATION_CHARS] + "..."
        lines.append(f"{number}. {render_call(interaction.call)} -> {text}")
    return "\n".join(lines)


def render_writing(query: str, answer: str | None) -> str:
    """The writer's output for a request (and answer): what it is taught and what it reads."""
    return f"Request: {' '.join(query.split())}\nAnswer: {answer if answer else '-'}"


def parse_writing(text: str) -> tuple[str, str | None]:
    """(request, answer or None) of a writer's reply; ValueError when it holds no request."""
    request = _REQUEST.search(text)
    if request is None:
        raise ValueError(f"no 'Request:' line in {text[:120]!r}")
    return request.group(1).strip(), parse_answer(text)


def parse_answer(text: str) -> str | None:
    """The value of a reply's 'Answer:' line; None when it has none or says none."""
    answer = _ANSWER.search(text)
    value = answer.group(1).strip() if answer else ""
    return None if value.lower() in _NO_ANSWER else value


_TOKEN = re.compile(r"[\w:.@+/-]+")


def _value_tokens(text: str) -> list[str]:
    """The parts of a free-text value the request (or an earlier result) must name: its
    numbers, dates, times and names, and its words of three letters or more. "training moved
    to 01-24 at 14:30" needs training, moved, 01-24 and 14:30 from somewhere, in any order;
    "to" and "at" are the agent's own. (A looser rule, numbers and names only, passed
    "Tell Gwen I'm moving to a new meeting" for the text "meeting moved".)"""
    return [
        token.strip(".")
        for token in _TOKEN.findall(text)
        if len(token.strip(".")) >= 3 or any(ch.isdigit() for ch in token) or token[:1].isupper()
    ]


_NUMBER_WORDS = {
    "1": ("a", "an", "one"), "2": ("two", "both"), "3": ("three",), "4": ("four",),
    "5": ("five",), "6": ("six",), "7": ("seven",), "8": ("eight",), "9": ("nine",),
    "10": ("ten",),
}  # fmt: skip


def _named(texts: Sequence[str], value: str) -> bool:
    """Whether one of ``texts`` names ``value``: whole, in the plural, or a small number
    in words ("a scarf", "Buy 2 bulbs")."""
    forms = (value, value + "s", value + "es", *_NUMBER_WORDS.get(value, ()))
    return any(mentions(text, form) for text in texts for form in forms)


def ungrounded_values(query: str, interactions: Sequence[Interaction]) -> list[str]:
    """Argument values of the calls that neither the request nor an earlier result names:
    the agent could not know them from the request, so the task would teach guessing.

    A one-word value must appear whole; a longer one (a message text) needs its words and
    values, in any order (``_value_tokens``)."""
    missing: list[str] = []
    seen: list[str] = [query]
    for interaction in interactions:
        for value in interaction.call.arguments.values():
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                continue
            text = str(value).strip()
            if not text or _named(seen, text):
                continue
            tokens = _value_tokens(text) if len(text.split()) > 1 else [text]
            if not all(_named(seen, token) for token in tokens):
                missing.append(text)
        seen.append(interaction.observation.text)
    return list(dict.fromkeys(missing))


def curation_problem(
    query: str,
    calls: Sequence[Interaction],
    given: AbstractionInput,
    queries: set[str],
    grounding: bool,
) -> str | None:
    """Why a written request is not kept, or None: it repeats a stored task or another
    candidate of the item (``queries``, normalised), or (``grounding``) leaves a value its
    calls need unnamed."""
    problem = repeats([query], given)
    if problem is None and normalise(query) in queries:
        problem = "duplicates another candidate of this item"
    if problem is None and grounding:
        missing = ungrounded_values(query, calls)
        if missing:
            problem = f"curation: the request does not name {', '.join(missing[:4])}"
    return problem


def succeeded(steps: Sequence[tuple[ToolCall | None, Observation]]) -> list[Interaction]:
    """The calls that ran without an error, in order, each once: failed calls change nothing
    to replay, and a call made again with the same arguments (a small policy looks the same
    contact up three times) would teach the repetition as part of the task."""
    kept: list[Interaction] = []
    seen: set[str] = set()
    for call, observation in steps:
        if call is None or observation.error:
            continue
        key = actions_key([call])
        if key in seen:
            continue
        seen.add(key)
        bare = ToolCall(name=call.name, arguments=call.arguments)
        kept.append(Interaction(call=bare, observation=observation))
    return kept


class TaskWriter:
    """An abstractor that asks a writer model for the request of calls that ran."""

    def __init__(
        self,
        model: Any,
        limiter: asyncio.Semaphore | None = None,
        prompt: str = WRITER_PROMPT,
        max_candidates: int = 3,
        material: WriterMaterial = "both",
        grounding: bool = True,
    ):
        if max_candidates < 1:
            raise ValueError("max_candidates must be >= 1")
        self.model = model
        self.limiter = limiter
        self.prompt = prompt
        self.max_candidates = max_candidates
        self.material = material
        self.grounding = grounding
        self.reads_exploration = material != "hindsight"
        self.name = f"abstractor:writer({model_label(model)}, {material})"

    def segments(self, given: AbstractionInput) -> list[Segment]:
        """(kind, setup, calls) of each distinct piece of material, hindsight first."""
        found: list[Segment] = []
        if self.material in ("hindsight", "both"):
            steps = [(step.call, step.observation) for step in given.item.trajectory.steps]
            found.append(("hindsight", dict(given.task.setup), succeeded(steps)))
        if self.material in ("explored", "both"):
            for exploration in given.rounds:
                steps = [(i.call, i.observation) for i in exploration.interactions]
                found.append(("explored", dict(exploration.setup), succeeded(steps)))
        distinct, keys = [], set()
        for kind, setup, calls in found:
            key = actions_key([i.call for i in calls], setup)
            if calls and key not in keys:
                keys.add(key)
                distinct.append((kind, setup, calls))
        return distinct

    async def abstract(self, given: AbstractionInput) -> Abstraction:
        task = given.task
        material = self.segments(given)[: self.max_candidates]
        if not material:
            why = "no call of the flagged trajectory or of the exploration rounds succeeded"
            return Abstraction(rejections=[RejectedCandidate(description=task.id, reason=why)])
        replies = await asyncio.gather(
            *(self._write(calls) for _, _, calls in material), return_exceptions=True
        )
        raise_unless_one_replied(replies)
        chosen: list[CandidateTask] = []
        rejected: list[RejectedCandidate] = []
        queries: set[str] = set()
        for (kind, setup, calls), reply in zip(material, replies, strict=True):
            description = f"{kind}: " + " > ".join(i.call.name for i in calls)
            if isinstance(reply, BaseException):
                rejected.append(RejectedCandidate(description=description, reason=str(reply)))
                continue
            try:
                query, answer = parse_writing(reply)
            except ValueError as err:
                reason = f"writer reply unreadable: {err}"
                rejected.append(RejectedCandidate(description=description, reason=reason))
                continue
            problem = curation_problem(query, calls, given, queries, self.grounding)
            if problem is not None:
                rejected.append(RejectedCandidate(description=description, reason=problem))
                continue
            queries.add(normalise(query))
            chosen.append(
                CandidateTask(
                    description=description,
                    query=query,
                    minimal_actions=[i.call for i in calls],
                    reference_answer=answer,
                    parent_task_id=task.id,
                    signal=primary_signal(given.item),
                    setup=candidate_setup(setup),
                    kind=kind,
                )
            )
        return Abstraction(candidates=chosen, rejections=rejected)

    async def _write(self, calls: Sequence[Interaction]) -> str:
        return await write(self.model, self.prompt, render_calls(calls), self.limiter)


async def write(
    model: Any, prompt: str, material: str, limiter: asyncio.Semaphore | None = None
) -> str:
    """The writer model's reply text to one piece of material (the writer's input)."""
    reply = await ask(model, [SystemMessage(prompt), HumanMessage(material)], limiter)
    content = getattr(reply, "content", reply)
    return content if isinstance(content, str) else str(content)
