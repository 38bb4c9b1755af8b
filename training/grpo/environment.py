"""A coevolve environment as TRL's GRPO tool loop wants it.

TRL's ``environment_factory`` calls an object's methods by tool name.
``environment_class`` builds a class with one method per tool schema (the
signature and a Google-style docstring from the schema, so TRL's
``get_json_schema`` reads it); each method forwards ``env.step(ToolCall(...))``
and returns the observation text. ``environment_score`` is the reward: the
environment's verifier on the episode as it stands.
"""

from __future__ import annotations

import inspect
import keyword
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ...agents.policy.conversation import shown_observation
from ...agents.policy.policy_interface import Message
from ...envs.base import Environment
from ...records import Step, Task, ToolCall, Trajectory

logger = logging.getLogger(__name__)

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}
_RESERVED = frozenset({"reset", "get_reward"})


class EpisodeEnvironment:
    """A coevolve environment as TRL's ``environment_factory`` wants it (tools added by subclassing).

    It records the episode's steps, answer and score, so the episode can be
    diagnosed (SEAL's labels) after the reward is computed.
    """

    def __init__(self, env: Environment) -> None:
        self._env = env
        self._task: Task | None = None
        self._steps: list[Step] = []
        self._answer: str | None = None
        self._score: float | None = None

    def reset(self, task: str | None = None, **_: Any) -> None:
        """Start the episode of the row's task (``task``: the Task as JSON)."""
        if task is None:
            raise ValueError("GRPO dataset rows need a 'task' column (the Task as JSON)")
        self._task = Task.model_validate_json(task)
        self._env.reset(self._task)
        self._steps, self._answer, self._score = [], None, None
        return None  # the query is already the prompt's user message

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        call = ToolCall(name=name, arguments=arguments)
        observation = self._env.step(call)
        self._steps.append(Step(turn=0, call=call, observation=observation))
        return shown_observation(observation.text)  # what a rollout shows the agent

    def _finish(self, answer: str | None) -> float:
        """Close the turn with the final answer (None: cut off) and return the verifier's score."""
        if answer is not None:
            self._env.end_turn(answer)
        self._answer = answer
        self._score = float(self._env.score())
        return self._score

    def _trajectory(self) -> Trajectory:
        if self._task is None:
            raise RuntimeError("no episode: reset() first")
        return Trajectory(
            id=f"{self._task.id}/grpo",
            task_id=self._task.id,
            env=self._task.env,
            family=self._task.family,
            steps=list(self._steps),
            final_answer=self._answer,
            score=min(max(self._score or 0.0, 0.0), 1.0),
            finished=self._answer is not None,
        )

    def _diagnosis(self) -> list[str]:
        """SEAL's labels of the finished episode; [] when the environment cannot diagnose."""
        diagnose = getattr(self._env, "diagnose", None)
        if diagnose is None or self._task is None:
            return []
        return list(diagnose(self._trajectory()))


def tool_method(name: str, function: dict[str, Any]) -> Callable[..., str]:
    parameters = function.get("parameters") or {}
    properties: dict[str, Any] = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())

    def method(self: EpisodeEnvironment, **arguments: Any) -> str:
        return self._call(name, arguments)

    signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    doc_args = []
    for parameter, spec in properties.items():
        if not parameter.isidentifier() or keyword.iskeyword(parameter):
            continue  # still accepted through **arguments; only undocumented
        kind = _JSON_TYPES.get(str(spec.get("type")), str)
        annotation = kind if parameter in required else kind | None
        signature.append(
            inspect.Parameter(
                parameter,
                inspect.Parameter.KEYWORD_ONLY,
                default=inspect.Parameter.empty if parameter in required else None,
                annotation=annotation,
            )
        )
        annotations[parameter] = annotation
        description = " ".join(str(spec.get("description") or parameter).split())
        doc_args.append(f"    {parameter}: {description}")
    annotations["return"] = str
    doc = " ".join(str(function.get("description") or name).split())
    if doc_args:
        doc += "\n\nArgs:\n" + "\n".join(doc_args)
    doc += "\n\nReturns:\n    The tool's result."
    method.__name__ = method.__qualname__ = name
    method.__doc__ = doc
    method.__annotations__ = annotations
    method.__signature__ = inspect.Signature(signature, return_annotation=str)  # type: ignore[attr-defined]
    return method


def environment_class(tool_schemas: Sequence[dict[str, Any]]) -> type[EpisodeEnvironment]:
    """An ``EpisodeEnvironment`` subclass with one method per tool (OpenAI function schemas)."""
    namespace: dict[str, Any] = {}
    for schema in tool_schemas:
        function = schema.get("function", schema)
        name = str(function.get("name", ""))
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
            logger.warning("tool %r cannot be a method name; GRPO episodes cannot call it", name)
            continue
        if name in _RESERVED or name in namespace:
            continue
        namespace[name] = tool_method(name, function)
    return type("GRPOToolEnvironment", (EpisodeEnvironment,), namespace)


def environment_score(
    completions: list[list[Message]], environments: list[EpisodeEnvironment], **_: Any
) -> list[float]:
    """Reward: the verifier's score of each finished episode (its last call-free message is the answer)."""
    rewards = []
    for completion, environment in zip(completions, environments, strict=True):
        answer = None
        if completion:
            last = completion[-1]
            if last.get("role") == "assistant" and not last.get("tool_calls"):
                answer = str(last.get("content") or "")
        rewards.append(environment._finish(answer))
    return rewards
