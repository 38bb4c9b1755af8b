"""The clause writer: a composed chain (agents/roles/composer.py) written one clause per call by
the task writer (agents/roles/task_writer.py, its prompt and format), each clause grounded on its
own, the clauses joined into one request.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...records import CandidateTask, ToolCall
from ..prompts import WRITER_PROMPT
from .abstractor import actions_key, normalise, repeats
from .composer import composed_calls
from .llm import model_label
from .replies import raise_unless_one_replied
from .role_interfaces import (
    Abstraction,
    AbstractionInput,
    Interaction,
    RejectedCandidate,
    candidate_setup,
    primary_signal,
)
from .task_writer import OBSERVATION_CHARS, parse_writing, render_calls, ungrounded_values, write

JOINER = ", then "


def clause_input(interaction: Interaction, earlier: Sequence[Interaction]) -> str:
    """What the writer reads for one clause: the earlier results that show one of the call's
    values ("Earlier result: id=c5 name=Lars ..."), then the call as ``render_calls`` writes
    it. Only those: the clause is about this call, not the ones before it."""
    values = [str(v) for v in interaction.call.arguments.values() if str(v).strip()]
    lines = []
    for before in earlier:
        text = " ".join(before.observation.text.split())
        if any(re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", text) for v in values):
            cut = text if len(text) <= OBSERVATION_CHARS else text[:OBSERVATION_CHARS] + "..."
            lines.append(f"Earlier result: {cut}")
    return "\n".join([*lines, render_calls([interaction])])


def clause_ungrounded(
    clause: str, interaction: Interaction, earlier: Sequence[Interaction], said: Sequence[str]
) -> list[str]:
    """The call's argument values that neither the clause, an earlier clause (``said``: the
    agent reads the whole request) nor an earlier result names (``ungrounded_values``)."""
    context = [clause, *said, *(i.observation.text for i in earlier)]
    return ungrounded_values("\n".join(context), [interaction])


def join_clauses(clauses: Sequence[str], calls: Sequence[ToolCall]) -> str:
    """One request of the clauses in order: "<first>, then <second>, then <third>." Each
    clause loses its closing stop; a later one starts lower-case unless its first word is a
    value of the calls (a name: "then Lars ..."); the last keeps a question mark."""
    values = {str(v) for call in calls for v in call.arguments.values()}
    parts = []
    for number, clause in enumerate(clauses):
        text = clause.strip().rstrip(".!;,")
        first = text.split(maxsplit=1)[0] if text else ""
        if number and first and first not in values and first[:1].isupper():
            text = text[:1].lower() + text[1:]
        parts.append(text.rstrip("?"))
    ending = "?" if clauses and clauses[-1].strip().endswith("?") else "."
    request = JOINER.join(parts) + ending
    return request[:1].upper() + request[1:]


@dataclass(frozen=True)
class _Clause:
    text: str
    answer: str | None


class ClauseWriter:
    """An abstractor that has the task writer write a composed chain one clause per call,
    grounds each clause, and joins them into one request (``join_clauses``)."""

    reads_exploration = True

    def __init__(
        self,
        model: Any,
        limiter: asyncio.Semaphore | None = None,
        prompt: str = WRITER_PROMPT,
        max_candidates: int = 3,
        grounding: bool = True,
    ):
        if max_candidates < 1:
            raise ValueError("max_candidates must be >= 1")
        self.model = model
        self.limiter = limiter
        self.prompt = prompt
        self.max_candidates = max_candidates
        self.grounding = grounding
        self.name = f"abstractor:clause-writer({model_label(model)})"

    def chains(self, given: AbstractionInput) -> tuple[list[tuple[dict, list[Interaction]]], list]:
        """(setup, calls) of each distinct round of two calls or more, and the rejections
        of the others."""
        chosen: list[tuple[dict, list[Interaction]]] = []
        rejected: list[RejectedCandidate] = []
        keys: set[str] = set()
        for number, exploration in enumerate(given.rounds, 1):
            calls = composed_calls(exploration.interactions)
            key = actions_key([i.call for i in calls], exploration.setup)
            if len(calls) < 2:
                why = f"round {number} composed {len(calls)} call(s) that ran; a chain needs two"
                rejected.append(RejectedCandidate(description=exploration.objective, reason=why))
            elif key not in keys:
                keys.add(key)
                chosen.append((dict(exploration.setup), calls))
        return chosen[: self.max_candidates], rejected

    async def abstract(self, given: AbstractionInput) -> Abstraction:
        chains, rejected = self.chains(given)
        if not chains:
            return Abstraction(rejections=rejected)
        asks = [
            self._write(clause_input(call, calls[:number]))
            for _, calls in chains
            for number, call in enumerate(calls)
        ]
        replies = list(await asyncio.gather(*asks, return_exceptions=True))
        raise_unless_one_replied(replies)
        chosen: list[CandidateTask] = []
        queries: set[str] = set()
        for setup, calls in chains:
            own, replies = replies[: len(calls)], replies[len(calls) :]
            description = "composed: " + " > ".join(i.call.name for i in calls)
            written = self._clauses(calls, own)
            if isinstance(written, str):
                rejected.append(RejectedCandidate(description=description, reason=written))
                continue
            query = join_clauses([c.text for c in written], [i.call for i in calls])
            problem = repeats([query], given)
            if problem is None and normalise(query) in queries:
                problem = "duplicates another candidate of this item"
            if problem is not None:
                rejected.append(RejectedCandidate(description=description, reason=problem))
                continue
            queries.add(normalise(query))
            chosen.append(
                CandidateTask(
                    description=description,
                    query=query,
                    minimal_actions=[i.call for i in calls],
                    reference_answer=written[-1].answer,
                    parent_task_id=given.task.id,
                    signal=primary_signal(given.item),
                    setup=candidate_setup(setup),
                    kind="composed",
                )
            )
        return Abstraction(candidates=chosen, rejections=rejected)

    def _clauses(
        self, calls: Sequence[Interaction], replies: Sequence[str | BaseException]
    ) -> list[_Clause] | str:
        """The chain's clauses, or why it is rejected, naming the clause."""
        clauses: list[_Clause] = []
        for number, (call, reply) in enumerate(zip(calls, replies, strict=True), 1):
            which = f"clause {number} ({call.call.name})"
            if isinstance(reply, BaseException):
                return f"{which}: the writer failed: {reply}"
            try:
                text, answer = parse_writing(reply)
            except ValueError as err:
                return f"{which}: writer reply unreadable: {err}"
            if self.grounding:
                said = [c.text for c in clauses]
                missing = clause_ungrounded(text, call, calls[: number - 1], said)
                if missing:
                    return f"curation: {which} {text!r} does not name {', '.join(missing[:4])}"
            clauses.append(_Clause(text, answer))
        return clauses

    async def _write(self, material: str) -> str:
        return await write(self.model, self.prompt, material, self.limiter)
