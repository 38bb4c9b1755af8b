"""SEAL's training-only interface: what training sees, that evaluation sees the raw env, no leaks."""

from __future__ import annotations

import json
import re

import pytest

from coevolve.agents.prompts import POLICY_SYSTEM_PROMPT
from coevolve.envs.adaptation import (
    OBSERVATION_NOTE,
    AdaptationConfig,
    LabelStats,
    TrainingInterface,
    adapt,
    adapt_system_prompt,
    annotate_schemas,
    select_guidelines,
)
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.records import ToolCall

ALL_ON = AdaptationConfig(enable=True, recovery_hints=True, guidelines=True)
PROFILE = {
    "state_mismatch": LabelStats(count=30, reward_mean=0.1),
    "argument_mismatch": LabelStats(count=20, reward_mean=0.2),
    "response_mismatch": LabelStats(count=9, reward_mean=0.5),
    "spurious_tool_call": LabelStats(count=7, reward_mean=0.0),  # too few
    "instance_mismatch": LabelStats(count=10, reward_mean=0.7),  # solved often enough
    "pass": LabelStats(count=10, reward_mean=0.9),  # never a guideline (counts in the total: 86)
}


def _episode(env, task, actions):
    """Everything the model is shown: tools each step, the system prompt, observations."""
    shown = [
        json.dumps(env.tools(), sort_keys=False),
        adapt_system_prompt(env, POLICY_SYSTEM_PROMPT),
    ]
    shown.append(env.reset(task))
    for action in actions:
        observation = env.step(action)
        shown += [observation.text, str(observation.error), json.dumps(env.tools())]
    shown.append(str(env.end_turn("Done.")))
    shown.append(repr(env.score()))
    return shown


@pytest.mark.parametrize("mode", ["eval", "validation", "test"])
def test_evaluation_interface_is_the_raw_environment_byte_for_byte(mode):
    task = load_split("heldout")[3]
    raw = WorldEnvironment()
    wrapped = adapt(WorldEnvironment(), mode, ALL_ON, PROFILE)
    assert type(wrapped) is WorldEnvironment  # not wrapped at all
    bad = ToolCall(name="find_contact", arguments={"name": "Nobody Here"})
    actions = [bad, ToolCall(name="nope"), *task.reference_calls]
    assert _episode(wrapped, task, actions) == _episode(raw, task, actions)
    # disabled adaptation in training is the raw environment too
    assert type(adapt(WorldEnvironment(), "train", AdaptationConfig())) is WorldEnvironment


def test_training_interface_annotates_only_text():
    task = load_split("heldout")[3]
    raw, env = WorldEnvironment(), adapt(WorldEnvironment(), "train", ALL_ON, PROFILE)
    assert isinstance(env, TrainingInterface)
    raw_tools, tools = raw.tools(), env.tools()
    assert raw.tools() == raw_tools  # the catalogue itself is untouched
    for before, after in zip(raw_tools, tools, strict=True):
        parameters = before["function"]["parameters"]
        for name, spec in parameters["properties"].items():
            annotated = after["function"]["parameters"]["properties"][name]["description"]
            expected = spec["description"] + (
                " [required]" if name in parameters["required"] else ""
            )
            assert annotated == expected
    prompt = env.adapt_system_prompt(POLICY_SYSTEM_PROMPT)
    assert prompt.startswith(POLICY_SYSTEM_PROMPT) and OBSERVATION_NOTE in prompt
    assert "[State-aware]" in prompt and "[Arguments]" in prompt and "[Format]" in prompt
    assert "[Cautious-call]" not in prompt and "[Scope]" not in prompt
    # observations keep their text and kind; the score is the raw verifier's
    env.reset(task)
    raw.reset(task)
    bad = ToolCall(name="find_contact", arguments={"name": "Nobody Here"})
    hinted, plain = env.step(bad), raw.step(bad)
    assert hinted.text.startswith(plain.text + "\n[ToolHint] ") and hinted.error == plain.error
    for call in task.reference_calls:
        assert env.step(call) == raw.step(call)
    env.end_turn("Done.")
    raw.end_turn("Done.")
    assert env.score() == raw.score() == 1.0 and env.hints_fired == 1


def test_enum_annotation():
    schema = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {
                    "unit": {"type": "string", "description": "Unit.", "enum": ["C", "F"]}
                },
                "required": [],
            },
        },
    }
    (annotated,) = annotate_schemas([schema])
    assert annotated["function"]["parameters"]["properties"]["unit"]["description"] == (
        "Unit. Allowed values: C, F."
    )
    assert schema["function"]["parameters"]["properties"]["unit"]["description"] == "Unit."


def test_guidelines_follow_seal_thresholds():
    assert select_guidelines(PROFILE, ALL_ON) == [
        "state_mismatch",
        "argument_mismatch",
        "response_mismatch",
    ]
    assert select_guidelines(PROFILE, ALL_ON.model_copy(update={"max_guidelines": 1})) == [
        "state_mismatch"
    ]
    assert select_guidelines({}, ALL_ON) == []


def _reference_values(task):
    return {str(v) for call in task.reference_calls for v in call.arguments.values()}


def test_hints_never_leak_reference_values():
    """Same error kind on different tasks: the same hint after masking the tool; no reference value."""
    hints = {}
    for family in ("update_phone", "send_message", "share_event_time"):
        task = next(t for t in load_split("heldout") if t.family == family)
        env = adapt(WorldEnvironment(), "train", ALL_ON)
        env.reset(task)
        wrong = [  # every error kind the hints know, each with values from the reference
            ToolCall(
                name="find_contact",
                arguments={"name": task.reference_calls[0].arguments.get("name", "Zed") + "x"},
            ),
            ToolCall(name="send_message", arguments={"contact_id": "c1"}),
            ToolCall(name="add_contact", arguments={"name": "Zed", "phone": "12"}),
            ToolCall(name="no_" + task.reference_calls[-1].name),
            ToolCall(name="read_note", arguments={"note_id": "n999"}),
        ]
        for call in wrong:
            observation = env.step(call)
            assert observation.error is not None
            hint = observation.text.split("\n[ToolHint] ", 1)[1]
            for value in _reference_values(task):
                assert not re.search(rf"\b{re.escape(value)}\b", hint), (value, hint)
            masked = hint.replace(call.name, "<tool>")
            hints.setdefault(observation.error, set()).add(masked)
    assert set(hints) >= {"not_found", "bad_arguments", "invalid_value", "unknown_tool"}
    assert all(len(variants) == 1 for variants in hints.values()), hints


def test_settings_are_documented_and_strict():
    for name, field in AdaptationConfig.model_fields.items():
        assert field.description, name
    with pytest.raises(ValueError):
        AdaptationConfig(max_guidelines=0)
    with pytest.raises(ValueError):
        AdaptationConfig(hints=True)
