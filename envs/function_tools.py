"""An environment from plain Python: tools as typed functions or as methods of a state class.

A user writes tools the way LangChain's ``@tool`` or OpenAI function schemas expect
them: type hints on every argument and a docstring whose first paragraph says what
the tool does and whose ``Args:`` section describes the arguments. Two shapes:

- **A state class.** Its public methods are the tools; ``reset`` builds it from the
  task's initial state (``StateClass(**state)``), and its final state is read back
  with ``model_dump()`` (pydantic), ``dataclasses.asdict`` or its public attributes::

      class Library:
          def __init__(self, books: dict, loans: dict): ...
          def find_book(self, title: str) -> str:
              \"\"\"Find a book by title.

              Args:
                  title: The book's title.
              \"\"\"

- **Functions.** Each takes the state (a dict, mutated in place) as its first argument,
  named ``state``; the schema leaves it out::

      def renew_loan(state: dict, loan_id: str) -> str: ...

A tool returns the observation (a string; anything else is shown as JSON) and raises
``ToolError(kind, message)`` for a domain error, which the agent sees as an error
observation. Any other exception is a bug in the tool: the agent sees a ``tool_failed``
observation (a rollout never stops on it) and ``coevolve env check`` names the task
whose reference call hit it.

The verifier replays the task's reference calls on its initial state and compares the
final states (and the answer, when the task expects one): ``FunctionEnvironment.score``.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import re
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from pydantic import TypeAdapter

from ..records import Observation, Task, ToolCall
from .base import ToolEnvironment, ToolError, answer_matches, tool_schema
from .brief import EnvironmentBrief, schema_brief
from .limits import TIMEOUT

# The error kind of a tool that raised something other than a ToolError.
TOOL_FAILED = "tool_failed"


def clone(state: Any) -> Any:
    """A deep copy of JSON-able state, as a JSON round trip makes it (keys strings, tuples
    lists), so a final state compares equal to the expected one however it was built."""
    return orjson.loads(orjson.dumps(state, option=orjson.OPT_NON_STR_KEYS, default=str))


# --------------------------------------------------------------------------- schemas

_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?)\s*:\s*$")


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The description (text before the first section) and the ``Args:`` entries of a
    Google-style docstring; continuation lines join their argument's description."""
    text = inspect.cleandoc(doc or "")
    description: list[str] = []
    arguments: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in text.splitlines():
        heading = _SECTION.match(line)
        if heading:
            section, current = heading.group(1), None
            continue
        if section is None:
            description.append(line)
        elif section in ("Args", "Arguments", "Parameters"):
            entry = _ARG_LINE.match(line)
            if entry and (current is None or not line.startswith(" " * 8)):
                current = entry.group(1).lstrip("*")
                arguments[current] = entry.group(2).strip()
            elif current is not None and line.strip():
                arguments[current] = f"{arguments[current]} {line.strip()}".strip()
    return " ".join(" ".join(description).split()), arguments


def _type_schema(hint: Any) -> dict[str, Any]:
    """The JSON schema of one argument's type, flattened to what the dispatcher checks:
    ``X | None`` becomes ``{"type": [X, "null"]}``."""
    schema = TypeAdapter(hint).json_schema()
    options = schema.get("anyOf")
    if options and all(set(option) <= {"type", "items"} for option in options):
        types = [option["type"] for option in options if "type" in option]
        merged: dict[str, Any] = {"type": types if len(types) > 1 else types[0]}
        items = [option["items"] for option in options if "items" in option]
        if items:
            merged["items"] = items[0]
        return merged
    schema.pop("title", None)
    return schema


def function_schema(
    function: Callable[..., Any], name: str | None = None, skip: Sequence[str] = ()
) -> dict[str, Any]:
    """The OpenAI function schema of a typed, docstringed function (``skip``: parameters
    the environment passes itself, such as ``self`` or ``state``).

    Raises ValueError naming the tool when an argument has no type hint or a type that
    has no JSON schema.
    """
    name = name or function.__name__
    description, documented = _parse_docstring(function.__doc__)
    try:
        hints = typing.get_type_hints(function)
    except (NameError, TypeError) as err:
        raise ValueError(f"tool {name}: its type hints cannot be read ({err})") from None
    properties: dict[str, Any] = {}
    required: list[str] = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name in skip or parameter.kind in (
            parameter.VAR_POSITIONAL,
            parameter.VAR_KEYWORD,
        ):
            continue
        if parameter.name not in hints:
            raise ValueError(f"tool {name}: argument {parameter.name!r} has no type hint")
        try:
            schema = _type_schema(hints[parameter.name])
        except Exception as err:  # pydantic's several schema errors for an unsupported type
            raise ValueError(
                f"tool {name}: argument {parameter.name!r} has a type with no JSON schema "
                f"({type(err).__name__})"
            ) from None
        if parameter.name in documented:
            schema["description"] = documented[parameter.name]
        if parameter.default is parameter.empty:
            required.append(parameter.name)
        properties[parameter.name] = schema
    return tool_schema(name, description or name.replace("_", " "), properties, required)


# --------------------------------------------------------------------------- tools


def _public_methods(state_class: type) -> list[str]:
    """The state class's tools: public functions defined on it and its own bases, in
    definition order (not object's, nor a pydantic model's model_dump and the like)."""
    names = []
    for klass in reversed(state_class.__mro__):
        if klass is object or klass.__module__.split(".")[0] == "pydantic":
            continue
        for attribute, value in vars(klass).items():
            if attribute.startswith("_") or attribute in names:
                continue
            if inspect.isfunction(value):
                names.append(attribute)
    return names


def _state_of(instance: Any) -> dict[str, Any]:
    """A state class instance's state as a JSON-able dict."""
    if hasattr(instance, "model_dump"):
        return clone(instance.model_dump(mode="json"))
    if dataclasses.is_dataclass(instance) and not isinstance(instance, type):
        return clone(dataclasses.asdict(instance))
    return clone({key: value for key, value in vars(instance).items() if not key.startswith("_")})


def _observation_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if result is None:
        return "ok"
    return json.dumps(result, default=str, sort_keys=True)


class FunctionEnvironment(ToolEnvironment):
    """An Environment whose tools are a state class's methods or plain functions.

    ``tools``: a state class, or functions taking ``state`` first. ``tasks``: the JSONL task
    file this environment's tasks come from (``coevolve.envs.task_file``); coevolve reads it
    when the environment is named in a config. ``name``: what messages call it.
    """

    def __init__(
        self,
        tools: type | Iterable[Callable[..., Any]],
        tasks: str | Path | None = None,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        self.state_class: type | None = tools if isinstance(tools, type) else None
        self.functions: dict[str, Callable[..., Any]] = {}
        if self.state_class is not None:
            methods = _public_methods(self.state_class)
            if not methods:
                raise ValueError(f"state class {self.state_class.__name__} has no public methods")
            self._schemas = [
                function_schema(getattr(self.state_class, method), skip=("self",))
                for method in methods
            ]
            default_name = self.state_class.__name__
            default_description = _parse_docstring(self.state_class.__doc__)[0]
        else:
            for function in tools:  # type: ignore[union-attr]
                parameters = list(inspect.signature(function).parameters)
                if not parameters or parameters[0] != "state":
                    raise ValueError(
                        f"tool {function.__name__}: a tool function takes the state first, "
                        "as a parameter named `state`"
                    )
                self.functions[function.__name__] = function
            if not self.functions:
                raise ValueError("FunctionEnvironment needs at least one tool")
            self._schemas = [
                function_schema(function, skip=("state",)) for function in self.functions.values()
            ]
            default_name = "tools"
            default_description = ""
        self.tool_names = tuple(schema["function"]["name"] for schema in self._schemas)
        self.tasks_path = Path(tasks) if tasks is not None else None
        self.name = name or default_name
        self.description = description or default_description or f"{len(self._schemas)} tools"
        self.task: Task | None = None
        self._state: Any = None  # the state class instance, or the functions' dict
        # The calls that reached a tool this episode (those that failed with a ToolError
        # too: a tool may change the state before it raises), to rebuild the state from.
        self._ran: list[ToolCall] = []
        self.answer: str | None = None
        self.turn = 0

    # ------------------------------------------------------------ state

    def new_state(self, initial: Mapping[str, Any]) -> Any:
        """A fresh state from a task's initial state."""
        if self.state_class is None:
            return clone(dict(initial))
        try:
            return self.state_class(**clone(dict(initial)))
        except TypeError as err:  # the initial state's keys do not fit the constructor
            raise ValueError(
                f"{self.state_class.__name__}(**state) refused the task's initial state: {err}"
            ) from None

    def current_state(self) -> dict[str, Any]:
        """The state now, as a JSON-able dict (what the verifier compares)."""
        if self._state is None:
            raise RuntimeError("the episode has not started: call reset(task) first")
        return clone(self._state) if self.state_class is None else _state_of(self._state)

    def replay_state(self, initial: Mapping[str, Any], calls: Sequence[ToolCall]) -> dict[str, Any]:
        """The state ``calls`` leave, started from ``initial``; a failing call changes
        nothing as far as the tools keep it so, as in an episode."""
        replica = self._replica(initial)
        for call in calls:
            replica.step(call)
        return replica.current_state()

    def _replica(self, initial: Mapping[str, Any]) -> FunctionEnvironment:
        """A copy that shares the tools, not the episode, started from ``initial``."""
        replica = copy.copy(self)
        replica._state = self.new_state(initial)
        replica._ran = []
        replica._stopped_by = None
        return replica

    # ------------------------------------------------------------ protocol

    def tools(self) -> list[dict[str, Any]]:
        return self._schemas

    def reset(self, task: Task) -> str:
        self.task = task
        self._state = self.new_state(task.setup.get("state", {}))
        self._ran = []
        self._stopped_by = None
        self.answer = None
        self.turn = 0
        return task.turns[0].query

    def _run_checked(self, call: ToolCall) -> Observation:
        observation = super()._run_checked(call)
        if observation.error not in (TIMEOUT, "not_started"):
            self._ran.append(call)
        return observation

    def _recover_after_timeout(self) -> bool:
        """A new state object, as the episode's earlier calls left the task's initial state:
        the late call runs on against the old object, which nothing reads any more."""
        if self.task is None:
            return False
        replica = self._replica(self.task.setup.get("state", {}))
        for call in self._ran:
            if replica.step(call).error == TIMEOUT:  # a call that ran in time before, not now
                return False
        self._state = replica._state
        return True

    def _execute(self, call: ToolCall) -> str:
        if self._state is None:
            raise ToolError("not_started", "the episode has not started: call reset(task) first")
        if self.state_class is not None:
            tool = getattr(self._state, call.name)
            arguments: tuple[Any, ...] = ()
        else:
            tool = self.functions[call.name]
            arguments = (self._state,)
        try:
            return _observation_text(tool(*arguments, **call.arguments))
        except ToolError:
            raise
        except Exception as err:  # the tool's bug becomes an observation; env check names it
            raise ToolError(
                TOOL_FAILED,
                f"{call.name} raised {type(err).__name__}: {err} (not a ToolError)",
            ) from None

    def score(self) -> float:
        """1.0 when the final state equals the reference's and the answer holds the expected
        one (when the task has one); else 0.0."""
        if self.task is None:
            raise RuntimeError("score() before reset()")
        return verify(self, self.task, self.current_state(), self.answer)

    def brief(self) -> EnvironmentBrief:
        """What the synthesis roles' prompts (and the policy's) say of it: the first
        paragraph of the state class's docstring (or of the tools' module's), else
        ``description``; the tools, their id arguments as the docstrings describe them (per
        tool where tools differ) and the examples their names and arguments give
        (``schema_brief``)."""
        owner = self.state_class or next(iter(self.functions.values()))
        module = inspect.getmodule(owner)
        # Their own docstrings (``__doc__``): inspect.getdoc would give a pydantic model's.
        documented = [getattr(self.state_class, "__doc__", None), getattr(module, "__doc__", None)]
        about = next(
            (inspect.cleandoc(doc).split("\n\n")[0] for doc in documented if doc), self.description
        )
        return schema_brief(" ".join(about.split()), self._schemas)

    # ------------------------------------------------------------ offline synthesis

    def describe(self, calls: Sequence[ToolCall], setup: Mapping[str, Any]) -> str:
        """A request for ``calls`` in the tools' own words (the first sentence of each
        docstring), naming the argument values a user would give and leaving out the ones an
        earlier call's one-line result shows, which the agent must look up and pass on::

            Find a customer by email address (email: ana@mail.com), then refund a
            delivered order (reason: damaged).

        Offline synthesis writes its tasks' text with it (``SupportsDescribe``)."""
        replica = self._replica(setup.get("state", {}))
        sentences = {
            schema["function"]["name"]: _first_sentence(schema["function"]["description"])
            for schema in self._schemas
        }
        seen = ""
        parts = []
        for call in calls:
            given = [
                f"{key}: {value if isinstance(value, str) else json.dumps(value)}"
                for key, value in call.arguments.items()
                if not _shows(seen, value)
            ]
            sentence = sentences.get(call.name, call.name.replace("_", " "))
            parts.append(sentence + (f" ({', '.join(given)})" if given else ""))
            observation = replica.step(call)
            # A one-line result names the thing it found; from a list of several the request
            # must still say which one, so its values stay in the text.
            if observation.error is None and "\n" not in observation.text.strip():
                seen += "\n" + observation.text
        if not parts:
            return ""
        text = ", then ".join([parts[0], *(part[:1].lower() + part[1:] for part in parts[1:])])
        return text + "."


def _first_sentence(description: str) -> str:
    return description.split(". ")[0].rstrip(".")


def _shows(text: str, value: Any) -> bool:
    """Whether an observation text shows ``value`` as a whole word (ids, names, numbers)."""
    shown = value if isinstance(value, str) else json.dumps(value)
    if not shown:
        return False
    return re.search(rf"(?<![\w-]){re.escape(shown)}(?![\w-])", text) is not None


def verify(
    env: FunctionEnvironment, task: Task, final_state: Mapping[str, Any], answer: str | None
) -> float:
    """The verifier: replay the reference on the initial state, compare final states and the
    answer."""
    expected = env.replay_state(task.setup.get("state", {}), task.reference_calls)
    if clone(dict(final_state)) != expected:
        return 0.0
    if task.reference_answer is not None and not answer_matches(answer, task.reference_answer):
        return 0.0
    return 1.0
