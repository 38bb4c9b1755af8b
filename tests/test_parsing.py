"""The shared tool-call parser: every shape models emit, and garbage never escapes."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coevolve.envs.parsing import ToolCallParseError, check_arguments, parse_tool_calls, render_call
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.records import ToolCall


def test_python_call_syntax():
    assert parse_tool_calls('find_contact(name="Ana")') == [
        ToolCall(name="find_contact", arguments={"name": "Ana"})
    ]
    calls = parse_tool_calls("[cd(folder='doc'), mv(source='a', destination=('b', 1))]")
    assert [c.name for c in calls] == ["cd", "mv"]
    assert calls[1].arguments == {"source": "a", "destination": ["b", 1]}


def test_tag_characters_inside_a_value_are_data():
    call = ToolCall(name="send_message", arguments={"contact_id": "c1", "text": "<tool_call>"})
    assert parse_tool_calls(render_call(call)) == [call]


def test_openai_shapes_and_tags():
    openai = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "top_up", "arguments": '{"amount": 5}'},
    }
    assert parse_tool_calls(openai) == [
        ToolCall(name="top_up", arguments={"amount": 5}, id="call_1")
    ]
    tagged = '<tool_call>\n{"name": "checkout", "arguments": {}}\n</tool_call>'
    assert parse_tool_calls(tagged) == [ToolCall(name="checkout")]
    assert [
        c.name for c in parse_tool_calls('[{"name": "a"}, {"name": "b", "arguments": "{}"}]')
    ] == ["a", "b"]
    assert parse_tool_calls('```json\n{"name": "view_cart", "arguments": {}}\n```') == [
        ToolCall(name="view_cart")
    ]


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("", "parse_error"),
        ('{"name": "x", "arguments": {', "bad_json"),
        ('{"function": {"name": "x", "arguments": "{nope"}}', "bad_json"),
        ("find_contact('Ana')", "bad_arguments"),
        ("find_contact(name=open('/etc/passwd').read())", "bad_arguments"),
        ("__import__('os').system('true')", "parse_error"),
        ("find_contact(**{'name': 'x'})", "bad_arguments"),
        ("(lambda: 1)()", "parse_error"),
        ("just some prose.", "parse_error"),
        ('{"arguments": {}}', "parse_error"),
        ('{"name": "x", "arguments": [1, 2]}', "bad_arguments"),
    ],
)
def test_malformed_output_is_a_parse_error(text, kind):
    with pytest.raises(ToolCallParseError) as info:
        parse_tool_calls(text)
    assert info.value.kind == kind


def test_nothing_is_executed(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(ToolCallParseError):
        parse_tool_calls(f"f(x=open({str(marker)!r}, 'w').write('x'))")
    assert not marker.exists()


def test_check_arguments_against_schema():
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "s": {"type": "string", "enum": ["a", "b"]},
            "l": {"type": "array", "items": {"type": "number"}},
        },
        "required": ["n"],
    }
    assert check_arguments({"n": 3, "s": "a", "l": [1, 2.5]}, schema) is None
    assert "missing required" in check_arguments({}, schema)
    assert "unknown argument 'x'" in check_arguments({"n": 1, "x": 1}, schema)
    assert "must be integer" in check_arguments({"n": "3"}, schema)
    assert "must be integer" in check_arguments({"n": True}, schema)
    assert "one of" in check_arguments({"n": 1, "s": "c"}, schema)
    assert "item 1" in check_arguments({"n": 1, "l": [1, "x"]}, schema)


literals = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
identifiers = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True).filter(
    lambda s: (
        s
        not in {
            "if",
            "in",
            "is",
            "or",
            "and",
            "not",
            "for",
            "def",
            "del",
            "try",
            "as",
            "with",
            "from",
            "else",
            "elif",
            "pass",
            "None",
            "True",
            "False",
            "class",
            "while",
            "break",
            "yield",
            "raise",
            "async",
            "await",
            "global",
            "lambda",
            "return",
            "assert",
            "import",
            "except",
            "finally",
            "continue",
            "nonlocal",
        }
    )
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(name=identifiers, arguments=st.dictionaries(identifiers, literals, max_size=4))
def test_render_then_parse_round_trips(name, arguments):
    call = ToolCall(name=name, arguments=json.loads(json.dumps(arguments)))
    assert parse_tool_calls(render_call(call)) == [call]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=st.text(max_size=120))
def test_arbitrary_text_never_raises_anything_else(text):
    try:
        calls = parse_tool_calls(text)
    except ToolCallParseError:
        return
    assert all(isinstance(call, ToolCall) for call in calls)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    text=st.text(max_size=80)
    | st.from_regex(r"[a-z_]{1,12}\((\w+=[^,)]{0,10},? ?){0,3}\)", fullmatch=True)
)
def test_env_step_turns_any_text_into_an_observation(text):
    env = WorldEnvironment()
    env.reset(load_split("validation", size=18)[0])
    observation = env.step(text)
    assert isinstance(observation.text, str)
