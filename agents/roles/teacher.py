"""The teacher: a model larger than the agent writes whole tasks by doing them.

Published methods that gain from synthetic tasks synthesize with a model stronger than
the agent, and execute every task (docs/synthesis.md). Here that model sits behind an
endpoint (on a CPU, Qwen2.5-Coder-1.5B-Instruct on llama.cpp: `make teacher`) and is
the explorer: each round it is shown worked examples, the seed tasks of the flagged
task's family with their calls replayed for real results, then a fresh environment
in the flagged task's state, and asked to write one new request of the same kind for
the entities there and to carry it out. It says what it did in a ``REQUEST:`` and an
``ANSWER:`` line (``ExplorationRound.written``).

The teacher writes its calls as the examples show them, numbered call lines
(``2. add_contact(name="Tom", phone="555-7890")``), one a reply, and is told each real
result in the same form. Offered the tools as bound schemas instead, Qwen2.5-Coder-1.5B
wrote a whole task with made-up results in one reply and no call a server read. A reply
stops at ``->``, where a made-up result would begin: on a CPU decoding is the cost.

``TeacherAbstractor`` turns such a round into a candidate: the request as written, the
calls that succeeded as its minimal actions, in order; value grounding (the request
must name every argument value no earlier result shows) and the repeat check as for
the task writer. Replay (the judge) then checks that the calls reach the answer.

The examples' order is fixed per family, so the opening of every round of a family is
the same text: a server with a prompt cache (llama-server keeps each slot's) reads the
tools and examples once. Nothing here reads a task generator, a describer or a split
other than the seed tasks it is given.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from ...envs.base import Environment
from ...envs.parsing import render_call
from ...records import CandidateTask, FlaggedTrajectory, SynthesisContext, Task, ToolCall
from ..policy.policy_interface import parse_assistant_text
from ..prompts import TEACHER_FOLLOW_UP, TEACHER_PROMPT
from .abstractor import normalise
from .explorer import LLMExplorer
from .llm import ReplyError, ask
from .role_interfaces import (
    Abstraction,
    AbstractionInput,
    EnvFactory,
    Interaction,
    RejectedCandidate,
    WrittenRequest,
    candidate_setup,
    primary_signal,
)
from .task_writer import (
    OBSERVATION_CHARS,
    curation_problem,
    parse_answer,
    parse_writing,
    succeeded,
)

log = logging.getLogger("coevolve.agents.teacher")  # its name from before agents/roles/ (run.log)


def _result(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= OBSERVATION_CHARS else text[:OBSERVATION_CHARS] + "..."


def worked_example(task: Task, make_env: EnvFactory, number: int) -> str:
    """A seed task as the teacher reads it: its request, its reference calls with the
    results a fresh environment gives them, and its answer."""
    env = make_env()
    env.reset(task)
    lines = [f"Example {number}", f"Request: {task.instruction}", "Calls:"]
    for step, call in enumerate(task.reference_calls, 1):
        lines.append(f"{step}. {render_call(call)} -> {_result(env.step(call).text)}")
    lines.append(f"Answer: {task.reference_answer or 'none'}")
    return "\n".join(lines)


def tool_lines(schemas: Sequence[Mapping[str, Any]]) -> str:
    """The tools as the teacher reads them: one line each, its signature and description."""
    lines = []
    for schema in schemas:
        function = schema.get("function", schema)
        properties = (function.get("parameters") or {}).get("properties") or {}
        required = set((function.get("parameters") or {}).get("required") or [])
        arguments = ", ".join(
            f"{name}{'' if name in required else '?'}: {spec.get('type', 'any')}"
            for name, spec in properties.items()
        )
        about = " ".join(str(function.get("description") or "").split()).split(". ")[0]
        lines.append(f"{function['name']}({arguments})" + (f" - {about}" if about else ""))
    return "\n".join(lines)


# A numbered call line, "3. send_message(...)", and what a reply may add after it.
_NUMBERED = re.compile(r"^\s*\d+\s*[.)]\s*(?=[A-Za-z_])")
_RESULT = re.compile(r"\s*->.*$")


def first_call(text: str, call_id: str) -> tuple[ToolCall | None, str | None]:
    """The first call a teacher's reply writes, in any form the policy reads or as a
    numbered line with a made-up result after it; (None, why) when it writes a call that
    cannot be read, (None, None) when it writes none."""
    for line in text.splitlines():
        candidate = _RESULT.sub("", _NUMBERED.sub("", line)).strip()
        if candidate.upper().startswith(("REQUEST", "ANSWER", "CALLS")) or not candidate:
            continue
        parsed = parse_assistant_text(candidate, call_id, read_json_calls=True)
        if parsed.tool_calls:
            return parsed.tool_calls[0], None
        if parsed.invalid_tool_calls and _NUMBERED.match(line):
            return None, parsed.invalid_tool_calls[0].message
    parsed = parse_assistant_text(text, call_id, read_json_calls=True)
    if parsed.tool_calls:
        return parsed.tool_calls[0], None
    return None, (parsed.invalid_tool_calls[0].message if parsed.invalid_tool_calls else None)


class TeacherExplorer(LLMExplorer):
    """An LLM explorer that writes a new task of the flagged family and carries it out,
    shown the family's seed tasks as worked examples."""

    def __init__(
        self,
        model: Any,
        examples: Mapping[str, Sequence[Task]],
        limiter: asyncio.Semaphore | None = None,
        rounds: int = 2,
        steps: int = 8,
        max_examples: int = 2,
        prompt: str = TEACHER_PROMPT,
    ):
        super().__init__(model, limiter, rounds=rounds, steps=steps, prompt=prompt)
        if max_examples < 0:
            raise ValueError(f"max_examples must be >= 0, got {max_examples}")
        # Sorted by id: the same examples open every round of a family (the prompt cache).
        self.examples = {
            family: sorted(tasks, key=lambda task: task.id) for family, tasks in examples.items()
        }
        self.max_examples = max_examples
        self.name = self.name.replace("explorer:llm(", "explorer:teacher(")

    def examples_for(self, task: Task) -> list[Task]:
        """The worked examples of ``task``'s family: seed tasks of it, then the task itself
        when the seeds are fewer (it is a training task too)."""
        chosen = [t for t in self.examples.get(task.family, []) if t.id != task.id]
        chosen = chosen[: self.max_examples]
        if len(chosen) < self.max_examples and task.reference_calls:
            chosen.append(task)
        return chosen

    def bind(self, env: Environment) -> Any:
        # No schemas sent: the tools are lines of the opening, as the examples' calls are.
        return self.model.bind(stop=["->"])

    def opening(
        self,
        item: FlaggedTrajectory,
        task: Task,
        context: SynthesisContext,
        objective: str,
        index: int,
        make_env: EnvFactory,
    ) -> list[BaseMessage]:
        examples = [
            worked_example(example, make_env, number)
            for number, example in enumerate(self.examples_for(task), 1)
        ]
        brief = [
            "Tools:\n" + tool_lines(make_env().tools()),
            "Worked examples (each ran in its own copy of the environment):",
            *examples,
            "Your environment is a fresh copy in another state. Write one new request of "
            f"the same kind and carry it out with at most {self.steps} calls. Reply with the "
            "REQUEST line and the first call.",
        ]
        return [SystemMessage(self.prompt), HumanMessage("\n\n".join(brief))]

    async def _converse(
        self,
        bound: Any,
        env: Environment,
        messages: list[BaseMessage],
        task: Task,
        index: int,
    ) -> list[Interaction]:
        """One numbered call a reply, run for real and answered with its real result, until
        the teacher writes its ANSWER line, stops writing calls, or the calls are spent."""
        interactions: list[Interaction] = []
        made = 0
        # A task of the family needs about as many calls as its examples: one more at most,
        # so a teacher that runs on past its request cannot add calls the request never asked.
        shown = [len(example.reference_calls) for example in self.examples_for(task)]
        budget = min(self.steps, max(shown) + 1) if shown else self.steps
        while made < budget:
            try:
                reply = await ask(bound, messages, self.limiter, model=self.model)
            except ReplyError as err:
                if not interactions:
                    raise
                log.warning("teacher round %d of %s: %s; keeps what it did", index, task.id, err)
                break
            text = reply.content if isinstance(reply.content, str) else ""
            messages.append(AIMessage(content=text))
            call, problem = first_call(text, f"call_{made}")
            if call is None:
                if problem is None or parse_answer(text) is not None:
                    break  # the answer, or no call at all: the round is over
                result = (
                    f"error: {problem}. Write the call as {made + 1}. tool_name(argument=value)"
                )
            else:
                observation = env.step(call)
                interactions.append(
                    Interaction(
                        call=ToolCall(name=call.name, arguments=call.arguments),
                        observation=observation,
                    )
                )
                result = f"{made + 1}. {render_call(call)} -> {_result(observation.text)}"
            made += 1
            messages.append(
                HumanMessage(
                    f"{result}\nWrite the next call as {made + 1}. tool_name(...), or the "
                    "line ANSWER: <the value the request asks for, or none> if it is done."
                )
            )
        return interactions

    async def written(
        self, bound: Any, messages: list[BaseMessage], interactions: list[Interaction]
    ) -> WrittenRequest | None:
        """The round's REQUEST and ANSWER lines; asked for once more if the teacher acted
        but never wrote its request."""
        found = _written(messages)
        if found is not None or not interactions:
            return found
        follow_up = [*messages, HumanMessage(TEACHER_FOLLOW_UP)]
        try:
            reply = await ask(self.model, follow_up, self.limiter, model=self.model)
        except ReplyError:
            return None
        return _written([*messages, reply])


def _written(messages: Sequence[BaseMessage]) -> WrittenRequest | None:
    """The first REQUEST line the teacher wrote, with the last ANSWER line after it."""
    texts = [m.content for m in messages if m.type == "ai" and isinstance(m.content, str)]
    for start, text in enumerate(texts):
        try:
            request, _ = parse_writing(text)
        except ValueError:
            continue
        answers = [parse_answer(later) for later in texts[start:]]
        answer = next((found for found in reversed(answers) if found is not None), None)
        return WrittenRequest(request=request, answer=answer)
    return None


class TeacherAbstractor:
    """Candidates from the requests the teacher wrote for its own rounds."""

    reads_exploration = True

    def __init__(self, max_candidates: int = 3, grounding: bool = True):
        if max_candidates < 1:
            raise ValueError("max_candidates must be >= 1")
        self.max_candidates = max_candidates
        self.grounding = grounding
        self.name = "abstractor:teacher-written"

    async def abstract(self, given: AbstractionInput) -> Abstraction:
        chosen: list[CandidateTask] = []
        rejected: list[RejectedCandidate] = []
        queries: set[str] = set()
        for number, exploration in enumerate(given.rounds, 1):
            description = f"teacher round {number}"
            if exploration.written is None:
                why = "the teacher wrote no REQUEST line for its round"
                rejected.append(RejectedCandidate(description=description, reason=why))
                continue
            query, answer = exploration.written.request, exploration.written.answer
            calls = succeeded([(i.call, i.observation) for i in exploration.interactions])
            problem = (
                curation_problem(query, calls, given, queries, self.grounding)
                if calls
                else "no call of the teacher's round succeeded"
            )
            if problem is not None:
                rejected.append(
                    RejectedCandidate(description=f"{description}: {query}", reason=problem)
                )
                continue
            queries.add(normalise(query))
            chosen.append(
                CandidateTask(
                    description=f"{description}: " + " > ".join(i.call.name for i in calls),
                    query=query,
                    minimal_actions=[i.call for i in calls],
                    reference_answer=answer,
                    parent_task_id=given.task.id,
                    signal=primary_signal(given.item),
                    setup=candidate_setup(exploration.setup),
                    kind="teacher",
                )
            )
            if len(chosen) >= self.max_candidates:
                break
        return Abstraction(candidates=chosen, rejections=rejected)
