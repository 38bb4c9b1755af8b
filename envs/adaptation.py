"""SEAL's training-only interface adaptation, as a wrapper around any environment.

During *training* rollouts the policy sees an annotated interface; at
*evaluation* and *validation* it sees the raw environment, byte for byte
(``adapt`` returns the environment itself). Tool semantics, observations'
content, the verifier and the diagnosis never change: only text shown to the
model is added. Three parts (SEAL, arXiv 2605.24426 §3.3 and App. D; released
code ``bfcl_env.py``):

- **Schema annotations** (``observation_lite``, the only part on in SEAL's
  reported runs): every required parameter's description gets `` [required]``,
  every parameter with an ``enum`` gets `` Allowed values: a, b, ...``, and the
  system prompt gets one observation note.
- **Recovery hints** (``tool_feedback_evolution``, optional): an error
  observation gets one ``[ToolHint]`` line chosen from the error kind (the
  world's kinds) or by SEAL's regexes on the error text (BFCL). Hints are
  templates filled only with the tool's name, argument *names* from the schema
  and available tool names; never with argument values, so they cannot leak a
  reference solution.
- **Guidelines** (``diagnostic_evolution``, optional): up to 3 system-prompt
  lines for labels with count >= 8, prevalence >= 0.10 and mean reward < 0.6 in
  the current failure profile (``CapabilityState`` window), ranked by
  prevalence x (1 - mean reward).

The system prompt is not part of the Environment protocol, so the wrapper
offers ``adapt_system_prompt(prompt)``; whoever builds the opening messages
(the GRPO rows, a rollout) calls it. A model prompted without tool schemas
(the in-process policies) sees the observation note and hints but not the
schema annotations.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..records import Observation, Step, Task, ToolCall
from .parsing import UNREADABLE_CALL

Mode = Literal["train", "validation", "eval", "test"]
TRAINING_MODES = frozenset({"train"})

OBSERVATION_NOTE = (
    "Observation note: parameters marked [required] must be provided exactly when calling a "
    "tool; do not invent tools outside the current schema."
)
GUIDELINES_HEADER = "# Behavioral guidelines (env-evolved from recent failures):"
GUIDELINES: dict[str, str] = {
    "spurious_tool_call": "[Cautious-call] If no available function clearly matches the user's "
    "request, respond in plain text rather than fabricating a tool call.",
    "empty_turn_model_response": "[Active-respond] When the user's request CAN be served by an "
    "available function, you MUST emit a tool_call rather than only replying in plain text.",
    "state_mismatch": "[State-aware] Before issuing a state-mutating call, re-read the most recent "
    "tool results to confirm the current state matches what the arguments assume.",
    "instance_mismatch": "[Scope] Verify that the instance/target your call refers to actually "
    "appeared in earlier tool results before calling on it.",
    "response_mismatch": "[Format] Match your final reply to the format implied by the user's "
    "request: lists, units, exact strings, ordering.",
    # The world's step labels (ours; SEAL has no line for them).
    "invalid_tool_call": "[Valid-call] Call only tools from the current schema, one well-formed "
    "call at a time.",
    "argument_mismatch": "[Arguments] Fill every required argument with a value of the type and "
    "form the schema describes.",
    "recovery_failure": "[Recover] After an error, change the call (or look the value up first) "
    "instead of giving up or repeating it.",
}
_NO_GUIDELINE = frozenset({"checker_error", "gt_error", "pass", "correct_abstention", "unknown"})


class AdaptationConfig(BaseModel):
    """What the training-only interface adds (all of it is off at evaluation and validation)."""

    model_config = ConfigDict(extra="forbid")

    enable: bool = Field(
        default=False,
        description="Wrap training rollouts in the adapted interface. Evaluation and validation "
        "always see the raw environment.",
    )
    schema_annotations: bool = Field(
        default=True,
        description="' [required]' and ' Allowed values: ...' in parameter descriptions, plus the "
        "observation note in the system prompt (SEAL's observation_lite; on in its reported runs).",
    )
    recovery_hints: bool = Field(
        default=False,
        description="Append one [ToolHint] line to error observations (SEAL's "
        "tool_feedback_evolution; off in its reported runs).",
    )
    guidelines: bool = Field(
        default=False,
        description="Add up to max_guidelines lines for frequent, unsolved failure labels to the "
        "system prompt (SEAL's diagnostic_evolution; off in its reported runs).",
    )
    max_guidelines: int = Field(default=3, ge=1, description="Most guideline lines (SEAL: 3).")
    guideline_min_count: int = Field(
        default=8, ge=1, description="A label needs this many occurrences (SEAL: 8)."
    )
    guideline_min_prevalence: float = Field(
        default=0.10,
        ge=0.0,
        le=1.0,
        description="... and this share of all non-excluded labels (SEAL: 0.10).",
    )
    guideline_max_reward: float = Field(
        default=0.6,
        ge=0.0,
        le=1.0,
        description="... and a mean reward below this (SEAL: 0.6); the line goes away once the "
        "label's mean reward reaches it.",
    )
    max_tool_names: int = Field(
        default=12, ge=1, description="Tool names listed in an unknown-tool hint (SEAL: 12)."
    )


class LabelStats(BaseModel):
    """The part of a failure profile the guidelines read: count and mean reward of one label."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(ge=0, description="Occurrences of the label.")
    reward_mean: float = Field(ge=0.0, le=1.0, description="Mean reward of its trajectories.")


def annotate_schemas(schemas: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Deep copies with ' [required]' and ' Allowed values: ...' added to parameter descriptions."""
    out: list[dict[str, Any]] = []
    for original in schemas:
        schema: dict[str, Any] = copy.deepcopy(dict(original))
        function = schema.get("function", schema)
        parameters = function.get("parameters") or {}
        required = set(parameters.get("required") or ())
        for name, spec in (parameters.get("properties") or {}).items():
            if not isinstance(spec, dict):
                continue
            description = str(spec.get("description") or "")
            if name in required:
                description += " [required]"
            if spec.get("enum"):
                description += " Allowed values: " + ", ".join(str(v) for v in spec["enum"]) + "."
            spec["description"] = description
        out.append(schema)
    return out


def select_guidelines(profile: Mapping[str, LabelStats], settings: AdaptationConfig) -> list[str]:
    """SEAL's diagnostic_evolution rule: the labels to write a guideline for, highest pressure first."""
    counted = {
        label: s for label, s in profile.items() if label not in ("checker_error", "gt_error")
    }
    total = sum(s.count for s in counted.values())
    if not total:
        return []
    ranked = []
    for label, stats in counted.items():
        if label in _NO_GUIDELINE or label not in GUIDELINES:
            continue
        prevalence = stats.count / total
        if (
            stats.count >= settings.guideline_min_count
            and prevalence >= settings.guideline_min_prevalence
            and stats.reward_mean < settings.guideline_max_reward
        ):
            ranked.append((prevalence * (1.0 - stats.reward_mean), label))
    ranked.sort(key=lambda item: (-item[0], item[1]))
    return [label for _, label in ranked[: settings.max_guidelines]]


# SEAL's _diagnose_tool_error patterns (BFCL error texts), in its order.
_BFCL_HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"missing \d+ required .*argument", re.I),
        "Required argument(s) for `{tool}` were missing ({required}). Re-emit the call with these "
        "keys present in `arguments`.",
    ),
    (
        re.compile(r"unexpected keyword argument", re.I),
        "`{tool}` does not accept one of the arguments you passed. Drop it and only use arguments "
        "listed in the tool schema ({parameters}).",
    ),
    (
        re.compile(r"no such (directory|file)", re.I),
        "The path you passed to `{tool}` does not exist in the current state. Inspect the latest "
        "state with a read/list-style tool first, then retry.",
    ),
    (
        re.compile(r"you cannot use path|use a single component", re.I),
        "`{tool}` rejects multi-component paths. Issue one navigation step at a time.",
    ),
    (
        re.compile(r"not authenticated|login.*required", re.I),
        "An authentication step is required before this call can succeed. Authenticate first, "
        "then retry.",
    ),
    (
        re.compile(r"tool not found|no such tool|unknown function|unknown tool", re.I),
        "`{tool}` is not in the available tool list. Available tools start with: {tools}. If no "
        "listed tool matches the user's request, reply in plain text.",
    ),
    (
        re.compile(r"expected .* got|must be .*, got", re.I),
        "`{tool}` rejected an argument type. Re-check argument types in the tool schema (string "
        "vs int vs list).",
    ),
)
_WELL_FORMED_CALL_HINT = (
    "Each tool call must be one well-formed call of a tool from the schema with its "
    "arguments; available tools start with: {tools}. If no tool fits, reply in plain text."
)
# The world's (and the dispatcher's) error kinds.
_KIND_HINTS: dict[str, str] = {
    "parse_error": _WELL_FORMED_CALL_HINT,
    # Text that looked like a call in no form the policy reads: the same advice.
    UNREADABLE_CALL: _WELL_FORMED_CALL_HINT,
    "unknown_tool": _BFCL_HINTS[5][1],
    "bad_arguments": "`{tool}` takes these arguments: {parameters} (required: {required}). "
    "Re-emit the call with exactly these keys and the types the schema gives.",
    "invalid_value": "A value passed to `{tool}` is not in the form the tool expects. Re-read the "
    "parameter descriptions of `{tool}` and retry with a corrected value.",
    "not_found": "`{tool}` could not find what you referred to. Look it up first with a "
    "find/list/search tool, then retry with an id or name from that result.",
}
_GENERIC_HINT = (
    "`{tool}` returned an error. Re-read the tool's parameter schema and retry with corrected "
    "arguments."
)


def recovery_hint(
    observation: Observation,
    tool: str | None,
    schemas: Mapping[str, Mapping[str, Any]],
    max_tool_names: int = 12,
) -> str | None:
    """One ``[ToolHint]`` line for an error observation, or None. Never contains argument values."""
    if observation.error is None:
        return None
    function = schemas.get(tool or "", {})
    parameters = function.get("parameters") or {}
    properties = list((parameters.get("properties") or {}).keys())
    fields = {
        "tool": tool or "the tool",
        "tools": ", ".join(list(schemas)[:max_tool_names]) or "(none)",
        "parameters": ", ".join(properties) or "none",
        "required": ", ".join(parameters.get("required") or ()) or "none",
    }
    template = _KIND_HINTS.get(observation.error)
    if template is None:
        template = next(
            (hint for pattern, hint in _BFCL_HINTS if pattern.search(observation.text)), None
        )
    if template is None and len(observation.text) < 200:
        template = _GENERIC_HINT
    if template is None:
        return None
    return "[ToolHint] " + template.format(**fields)


class TrainingInterface:
    """An environment with SEAL's training-time interface (see the module docstring).

    Everything not overridden here (describe, sample_action, diagnose, progress,
    ...) is the inner environment's.
    """

    def __init__(
        self,
        env: Any,
        settings: AdaptationConfig,
        profile: Mapping[str, LabelStats] | None = None,
    ) -> None:
        self.env = env
        self.settings = settings
        self.name = env.name
        self.guideline_labels = (
            select_guidelines(profile or {}, settings) if settings.guidelines else []
        )
        self.hints_fired = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def tools(self) -> list[dict[str, Any]]:
        schemas = self.env.tools()
        return annotate_schemas(schemas) if self.settings.schema_annotations else schemas

    def adapt_system_prompt(self, prompt: str | None) -> str | None:
        extra = [OBSERVATION_NOTE] if self.settings.schema_annotations else []
        if self.guideline_labels:
            extra.append(GUIDELINES_HEADER)
            extra += [GUIDELINES[label] for label in self.guideline_labels]
        if not extra:
            return prompt
        added = "\n".join(extra)
        return f"{prompt}\n\n{added}" if prompt else added

    def reset(self, task: Task) -> str:
        self.hints_fired = 0
        return str(self.env.reset(task))

    def step(self, action: ToolCall | str | Mapping[str, Any]) -> Observation:
        observation: Observation = self.env.step(action)
        if not self.settings.recovery_hints or observation.error is None:
            return observation
        tool = action.name if isinstance(action, ToolCall) else None
        schemas = {s.get("function", s)["name"]: s.get("function", s) for s in self.env.tools()}
        hint = recovery_hint(observation, tool, schemas, self.settings.max_tool_names)
        if hint is None:
            return observation
        self.hints_fired += 1
        return Observation(text=f"{observation.text}\n{hint}", error=observation.error)

    def end_turn(self, answer: str | None = None) -> str | None:
        return self.env.end_turn(answer)

    def score(self) -> float:
        return float(self.env.score())

    def action_pattern(self, steps: Sequence[Step]) -> str:
        return str(self.env.action_pattern(steps))


def adapt(
    env: Any,
    mode: Mode,
    settings: AdaptationConfig,
    profile: Mapping[str, LabelStats] | None = None,
) -> Any:
    """The training interface around ``env`` in training mode; ``env`` itself otherwise.

    The hard rule: evaluation, validation and test rollouts get the raw
    environment object, so their interface is the raw one byte for byte.
    """
    if mode not in TRAINING_MODES or not settings.enable:
        return env
    return TrainingInterface(env, settings, profile)


def adapt_system_prompt(env: Any, prompt: str | None) -> str | None:
    """The system prompt as ``env`` wants it shown: adapted for a TrainingInterface, else unchanged."""
    if isinstance(env, TrainingInterface):
        return env.adapt_system_prompt(prompt)
    return prompt
