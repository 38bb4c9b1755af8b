"""The Environment protocol and the base class both environments share.

An episode, as the rollout engine drives it::

    query = env.reset(task)                  # first user message
    while query is not None:
        ...policy proposes calls...
        obs = env.step(call)                 # errors come back as observations
        ...when the policy answers without calls...
        query = env.end_turn(answer)         # next user message, or None at the end
    score = env.score()                      # the executable verifier, in [0, 1]

Tool schemas are in OpenAI function format and may change between turns
(BFCL's missing-function turns add tools), so ask ``env.tools()`` every turn.
"""

from __future__ import annotations

import difflib
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..records import Observation, Step, Task, ToolCall, is_success
from .limits import TIMEOUT, ToolTimeout, call_with_time_limit, stopped_message, tool_limits
from .parsing import ToolCallParseError, check_arguments, parse_tool_calls


@runtime_checkable
class Environment(Protocol):
    """What the rest of coevolve needs from an environment."""

    name: str

    def tools(self) -> list[dict[str, Any]]:
        """Tool schemas available now, in OpenAI function format. When they change,
        return a new list: an endpoint policy encodes a list it has sent before once."""
        ...

    def reset(self, task: Task) -> str:
        """Start an episode of ``task`` from its initial state; return the first user message."""
        ...

    def step(self, action: ToolCall | str | Mapping[str, Any]) -> Observation:
        """Run one tool call (or model text holding one). Never raises for bad input."""
        ...

    def end_turn(self, answer: str | None = None) -> str | None:
        """Close the current user turn; return the next user message or None when done."""
        ...

    def score(self) -> float:
        """The executable verifier: how well the episode solved the task, in [0, 1]."""
        ...

    def action_pattern(self, steps: Sequence[Step]) -> str:
        """A short key for the rare-pattern signal (tool sequence with error kinds)."""
        ...


# Optional methods: offline synthesis uses them where an environment has them
# (``isinstance(env, SupportsDescribe)``) and falls back to something generic where not.


@runtime_checkable
class SupportsDescribe(Protocol):
    """Instructions in words for action sequences (the offline abstractor's task text;
    without it the text lists the calls)."""

    def describe(self, calls: Sequence[ToolCall], setup: Mapping[str, Any]) -> str:
        """Write an instruction that a valid action sequence fulfils."""
        ...


@runtime_checkable
class SupportsSampleAction(Protocol):
    """Valid random calls (the offline explorer's random walks; without it the explorer
    perturbs the reference solution)."""

    def sample_action(
        self, rng: random.Random, focus_tools: Sequence[str] | None = None
    ) -> ToolCall | None:
        """A call that is valid in the current state (for offline exploration)."""
        ...


@runtime_checkable
class SupportsActionWindows(Protocol):
    """What the offline abstractor needs to cut a task out of the middle of an exploration
    round: which calls change the state, the setup a task starting after some calls has,
    and the answer a lone lookup gives. Without it every successful call counts as a state
    change, and a task starts where its round did."""

    def changes_state(self, call: ToolCall) -> bool:
        """Whether the call can change the state (False: a lookup)."""
        ...

    def setup_after(self, setup: Mapping[str, Any], calls: Sequence[ToolCall]) -> dict[str, Any]:
        """The setup entries (e.g. ``state``) of the state ``calls`` leave, started from ``setup``."""
        ...

    def lookup_answer(self, call: ToolCall, observation: Observation) -> str | None:
        """The value a lookup's observation answers on its own, for a question task; None if none."""
        ...


@runtime_checkable
class SupportsVariants(Protocol):
    """Structure-keeping task variants, so offline synthesis can reinforce a failing structure.

    ``structure_key`` names a task's structure from its own calls (the world: the
    family whose tool graph the calls follow), never from where the task came from.
    ``variant`` makes a new task with the same structure (the same tool graph, values
    flowing between calls as in the original) on new entities and a new initial state,
    drawn from training values only; ``part=(start, end)`` asks for a task whose
    solution is only those calls of that structure (its first steps, or one
    transition on its own), or None when the environment cannot make it.
    """

    def structure_key(self, calls: Sequence[ToolCall]) -> str: ...

    def variant(self, task: Task, key: str, part: tuple[int, int] | None = None) -> Task | None: ...


class ToolError(Exception):
    """Raised by a tool implementation for a domain error (becomes an observation)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# How a task that does not fit its environment fails to run: a setup without the parts
# reset() needs (ValueError, KeyError), no turns (IndexError), a verifier that cannot
# read it (RuntimeError). Pydantic's ValidationError is a ValueError.
TASK_ERRORS: tuple[type[Exception], ...] = (ValueError, LookupError, RuntimeError)


def tool_schema(
    name: str, description: str, properties: dict[str, Any], required: Sequence[str] = ()
) -> dict:
    """An OpenAI function-tool schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(required)},
        },
    }


def default_action_pattern(steps: Sequence[Step]) -> str:
    """Tool names in order, each with ``!error_kind`` when it failed; ``?`` for unparsed text."""
    parts = []
    for step in steps:
        name = step.call.name if step.call is not None else "?"
        parts.append(f"{name}!{step.observation.error}" if step.observation.error else name)
    return ">".join(parts) if parts else "(no actions)"


class ToolEnvironment:
    """Shared plumbing: parse, check the tool and its arguments, dispatch, catch.

    Subclasses fill ``tools()``, ``_execute``, ``reset`` and ``score``; ``end_turn`` moves
    to the task's next user turn for those that keep ``task``, ``turn`` and ``answer``.
    Every call runs within this process's time limit (``envs/limits.py``): one past it is
    answered with an error of kind ``timeout`` naming the tool and the limit.
    """

    name = "base"
    task: Task | None = None
    turn: int = 0
    answer: str | None = None
    # Why the tools answer nothing more this episode (a call past the time limit that the
    # environment could not recover from); each subclass's reset() clears it.
    _stopped_by: str | None = None

    def tools(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _execute(self, call: ToolCall) -> str:
        """Run a checked call against the state; raise ToolError for domain errors."""
        raise NotImplementedError

    def step(self, action: ToolCall | str | Mapping[str, Any]) -> Observation:
        if not isinstance(action, ToolCall):
            try:
                calls = parse_tool_calls(action)
            except ToolCallParseError as err:
                return Observation(text=f"error: {err}", error=err.kind)
            if len(calls) != 1:
                return Observation(
                    text=f"error: expected exactly one tool call per step, got {len(calls)}",
                    error="parse_error",
                )
            action = calls[0]
        schemas = {schema["function"]["name"]: schema["function"] for schema in self.tools()}
        schema = schemas.get(action.name)
        if schema is None:
            close = difflib.get_close_matches(action.name, list(schemas), n=3, cutoff=0.5)
            hint = (
                f"did you mean {', '.join(close)}?"
                if close
                else f"{len(schemas)} tools are available"
            )
            return Observation(
                text=f"error: unknown tool {action.name!r}; {hint}", error="unknown_tool"
            )
        problem = check_arguments(action.arguments, schema.get("parameters", {}))
        if problem:
            return Observation(text=f"error: {action.name}: {problem}", error="bad_arguments")
        return self._run_checked(action)

    def _run_checked(self, call: ToolCall) -> Observation:
        """Run a call the dispatcher accepted, within the time limit (envs/limits.py)."""
        if self._stopped_by is not None:
            return Observation(text=f"error: {self._stopped_by}", error=TIMEOUT)
        # Anything but a ToolError is a bug in the tool and propagates; an environment whose
        # tools are third-party code turns their failures into ToolErrors (BfclEnvironment).
        try:
            text = call_with_time_limit(
                call.name, lambda: self._execute(call), tool_limits().timeout_s
            )
        except ToolError as err:
            return Observation(text=f"error: {err}", error=err.kind)
        except ToolTimeout as err:
            if not self._recover_after_timeout():
                self._stopped_by = stopped_message(err)
            return Observation(text=f"error: {err}", error=TIMEOUT)
        return Observation(text=text)

    def _recover_after_timeout(self) -> bool:
        """Put the episode's state back as the calls before the late one left it, out of the
        late call's reach (it runs on in its thread); False when this environment cannot, and
        every later step of the episode then answers with a timeout error instead."""
        return False

    def end_turn(self, answer: str | None = None) -> str | None:
        if self.task is None:
            raise RuntimeError("end_turn() before reset()")
        if answer is not None:
            self.answer = answer
        self.turn += 1
        return self.task.turns[self.turn].query if self.turn < len(self.task.turns) else None

    def action_pattern(self, steps: Sequence[Step]) -> str:
        return default_action_pattern(steps)


# --------------------------------------------------------------------------- text

# How the world's verifier compares messages and answers, and the judge finds an
# expected answer in a replay's observations (in any environment).
_TEXT_TOKEN = re.compile(r"[a-z0-9]+(?:[-:.][a-z0-9]+)*")


def normalize_text(text: str) -> str:
    """Case, spacing, quotes and trailing punctuation do not change a message's meaning."""
    return " ".join(_TEXT_TOKEN.findall(text.lower()))


def answer_matches(answer: str | None, expected: str) -> bool:
    """The expected value appears in the answer as whole tokens (numbers compared as numbers)."""
    if answer is None:
        return False
    tokens = _TEXT_TOKEN.findall(answer.lower())
    wanted = _TEXT_TOKEN.findall(expected.lower())
    if not wanted:
        return True
    if len(wanted) == 1 and _is_number(wanted[0]):
        return any(_is_number(tok) and float(tok) == float(wanted[0]) for tok in tokens)
    return any(tokens[i : i + len(wanted)] == wanted for i in range(len(tokens) - len(wanted) + 1))


def answer_in_observations(steps: Sequence[Step], expected: str) -> bool:
    """The expected answer appears in the observation of a call that succeeded: an answer
    the agent can read off its tools, not one it would have to make up. The judge asks it
    of a synthesized task, the task file of a reference answer, ``env check`` of both."""
    return any(
        answer_matches(step.observation.text, expected)
        for step in steps
        if not step.observation.error
    )


def unsupported_answer(expected: str) -> str:
    """Why a task whose answer ``answer_in_observations`` does not find is refused."""
    return (
        f"the expected answer {expected!r} appears in no observation of the reference "
        "replay, so an agent could only make it up"
    )


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- replay


def replay_reference(
    env: Environment,
    task: Task,
    *,
    calls: bool = True,
    answers: Sequence[str | None] | None = None,
) -> tuple[float, list[Step]]:
    """Run a task's reference solution through the environment; return (score, steps).

    Each turn ends with its entry of ``answers`` (default: the reference answer
    after the last turn, nothing before). ``calls=False`` makes no call and gives
    no answer: the score of doing nothing.
    """
    if answers is not None and len(answers) != len(task.turns):
        raise ValueError(
            f"{len(answers)} answers given for the {len(task.turns)} turns of {task.id}"
        )
    steps: list[Step] = []
    env.reset(task)
    for index, turn in enumerate(task.turns):
        for call in turn.reference_calls if calls else []:
            steps.append(Step(turn=index, call=call, observation=env.step(call)))
        if not calls:
            answer = None
        elif answers is not None:
            answer = answers[index]
        else:
            answer = task.reference_answer if index == len(task.turns) - 1 else None
        env.end_turn(answer)
    return env.score(), steps


@dataclass
class CheckReport:
    """The result of replaying every reference solution of a task set."""

    env: str
    scope: dict[str, str]
    verified: int = 0
    total: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"env": self.env, **self.scope, "verified": self.verified, "total": self.total}


def check_references(
    make_env: Callable[[], Environment],
    tasks: Iterable[Task],
    env_name: str,
    scope: dict[str, str],
    progress: Callable[[Iterable[Task]], Iterable[Task]] | None = None,
) -> CheckReport:
    """Replay each task's reference in a fresh environment; full score, with the expected
    answer (if any) found in an observation, counts as verified."""
    report = CheckReport(env=env_name, scope=scope)
    items = progress(tasks) if progress else tasks
    for task in items:
        report.total += 1
        try:
            score, steps = replay_reference(make_env(), task)
        except TASK_ERRORS as err:  # a task the environment cannot run is reported, not fatal
            report.failures.append({"task": task.id, "error": f"{type(err).__name__}: {err}"})
            continue
        answer = task.reference_answer
        if is_success(score) and answer is not None and not answer_in_observations(steps, answer):
            report.failures.append(
                {"task": task.id, "score": score, "errors": [unsupported_answer(answer)]}
            )
        elif is_success(score):
            report.verified += 1
        else:
            errors = [s.observation.text for s in steps if s.observation.error]
            report.failures.append({"task": task.id, "score": score, "errors": errors[:3]})
    return report
