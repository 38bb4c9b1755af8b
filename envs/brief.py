"""What an environment is, in words: ``EnvironmentBrief``, the environment's own
(``SupportsBrief``) or made from its tool schemas (``schema_brief``).

The LLM synthesis roles' prompts and, on a user's environment, the policy's system prompt
say it (``agents/prompts.py``); ``coevolve env prompts ENV`` prints them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from ..records import Task

if TYPE_CHECKING:  # pragma: no cover
    from .base import Environment


class EnvironmentBrief(BaseModel):
    """What an environment is, in words: the LLM synthesis roles' prompts and, on a user's
    environment, the policy's system prompt say it (``agents/prompts.py``: the
    ``{environment}`` slot, and one slot per example).

    The examples are the environment's own: its tool names, a seed task's tool sequence,
    its arguments. An empty one reads as a neutral phrase that names no environment's
    things (``agents/prompts.py``, ``EXAMPLE_DEFAULTS``)."""

    model_config = ConfigDict(extra="forbid")

    description: str = Field(description="What the environment is, in a sentence or two.")
    tools: list[str] = Field(
        default_factory=list,
        description="Its tool names; empty where each task brings its own (BFCL).",
    )
    ids: str = Field(
        default="", description="How its ids look and are passed on; empty when it has none."
    )
    action_pattern: str = Field(
        default="",
        description="A short action pattern of its tasks, as the summarizer's example "
        '("find_customer > list_orders"): a seed task\'s tool sequence; empty: its first tools.',
    )
    lookups: str = Field(
        default="", description="Its calls that only read, as the explorer's example."
    )
    variations: str = Field(
        default="", description="What a realistic variation of a task changes, in its terms."
    )
    known_values: str = Field(
        default="",
        description="What a user's request names things by instead of ids (its arguments "
        "that are not ids).",
    )
    answer_values: str = Field(
        default="", description="What the answer to a question asked of it looks like."
    )


@runtime_checkable
class SupportsBrief(Protocol):
    """Its own words for the synthesis roles' prompts; without it the brief is made from the
    tool schemas and the docstrings (``agents/prompts.py``, ``environment_brief``)."""

    def brief(self) -> EnvironmentBrief: ...


# Tool names that start with one of these read state (the explorer's lookups example).
_LOOKUP_VERBS = frozenset(
    "find list search get read show lookup look check view query fetch count describe".split()
)


def _is_id(argument: str) -> bool:
    return argument == "id" or argument.endswith("_id") or argument.endswith("_ids")


def schema_brief(
    description: str, schemas: Sequence[Mapping[str, Any]], tasks: Sequence[Task] = ()
) -> EnvironmentBrief:
    """A brief from a description and the tool schemas: the tool names, the id parameters
    with their documented descriptions ("customer_id: The customer's id, e.g. C-101"),
    which say how ids look where a docstring does, and examples from the tools (the
    lookups, the arguments a request states) and from ``tasks`` (a seed task's tool
    sequence). An id several tools take with different descriptions is described per
    tool ("target_account_id in add_payee: ...; in transfer: ...")."""
    functions = [schema.get("function", schema) for schema in schemas]
    names = [str(function.get("name")) for function in functions]
    documented: dict[str, dict[str, str]] = {}  # argument -> tool -> its description
    stated: list[str] = []  # the arguments that are not ids, in first use order
    for name, function in zip(names, functions, strict=True):
        properties = function.get("parameters", {}).get("properties", {}) or {}
        for argument, prop in properties.items():
            if _is_id(argument):
                text = str(prop.get("description", "")).strip().rstrip(".")
                documented.setdefault(argument, {})[name] = text
            elif argument not in stated:
                stated.append(argument)
    ids = "; ".join(_id_text(argument, by_tool) for argument, by_tool in documented.items())
    known = ", ".join(argument.replace("_", " ") for argument in stated)
    return EnvironmentBrief(
        description=description,
        tools=names,
        ids=f"ids come from one call's result and go into later calls ({ids})" if ids else "",
        action_pattern=task_action_pattern(tasks),
        lookups=", ".join(name for name in names if name.split("_")[0].lower() in _LOOKUP_VERBS),
        variations=f"other values of {known}" if known else "",
        known_values=known,
    )


def _id_text(argument: str, by_tool: Mapping[str, str]) -> str:
    """One id argument as the brief says it: once where every tool taking it describes it
    alike, else per tool (the tools that leave it undescribed are not named)."""
    texts = list(dict.fromkeys(by_tool.values()))
    if len(texts) == 1:
        return f"{argument}: {texts[0]}" if texts[0] else argument
    per_tool = [
        f"in {', '.join(tool for tool, said in by_tool.items() if said == text)}: {text}"
        for text in texts
        if text
    ]
    return f"{argument} {'; '.join(per_tool)}"


def task_action_pattern(tasks: Sequence[Task], longest: int = 3) -> str:
    """The tool sequence of the first of ``tasks`` whose reference makes two calls or more
    (up to ``longest``), as "find_customer > list_orders"; empty when none does."""
    for task in tasks:
        calls = task.reference_calls
        if len(calls) >= 2:
            return " > ".join(call.name for call in calls[:longest])
    return ""


def environment_brief(env: Environment, tasks: Sequence[Task] = ()) -> EnvironmentBrief:
    """The environment's own brief (``SupportsBrief``), or one made from its description (or
    its class's docstring) and its tool schemas; its action pattern, where it gives none,
    from ``tasks`` (the run's seed tasks)."""
    if isinstance(env, SupportsBrief):
        brief = env.brief()
    else:
        description = str(getattr(env, "description", "") or "").strip()
        if not description:
            description = (type(env).__doc__ or "").strip().split("\n\n")[0]
        brief = schema_brief(
            " ".join(description.split()) or f"the {env.name} environment", env.tools()
        )
    if not brief.action_pattern and task_action_pattern(tasks):
        brief = brief.model_copy(update={"action_pattern": task_action_pattern(tasks)})
    return brief
