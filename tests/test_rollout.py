"""The rollout engine and evaluation, with the oracle and with scripted policies."""

import pytest

from coevolve.agents.policy.eval_report import evaluation_report
from coevolve.agents.policy.oracle import OraclePolicy
from coevolve.agents.policy.policy_interface import (
    AssistantMessage,
    InvalidToolCall,
    parse_assistant_text,
)
from coevolve.agents.policy.rollout import run_rollouts
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.records import ToolCall, Trajectory


class ScriptedPolicy:
    """A unit-test stand-in: ``reply(index, conversation)`` decides each message."""

    version = "scripted"

    def __init__(self, reply):
        self.reply = reply
        self.batches = []

    async def generate(self, conversations, tools, temperature=None):
        self.batches.append(len(conversations))
        return [self.reply(i, c) for i, c in enumerate(conversations)]

    async def aclose(self):
        pass


TASKS = load_split("validation", size=18)


def test_oracle_through_the_engine_scores_everything():
    trajectories = run_rollouts(OraclePolicy(), WorldEnvironment, TASKS, k=2, progress=False)
    assert len(trajectories) == 36 and len({t.id for t in trajectories}) == 36
    report = evaluation_report(trajectories, TASKS, "world", {"split": "validation"}, "oracle")
    assert report.overall.success_rate == 1.0
    assert report.overall.tool_sequence_accuracy == report.overall.call_accuracy == 1.0
    first = trajectories[0]
    assert first.policy_version == "oracle" and first.finished and first.error is None
    assert [m["role"] for m in first.messages[:2]] == ["system", "user"]
    assert first.messages[-1] == {"role": "assistant", "content": first.final_answer}


def test_episodes_are_batched_in_lockstep():
    policy = ScriptedPolicy(lambda i, c: AssistantMessage(content="done"))
    run_rollouts(policy, WorldEnvironment, TASKS, k=3, progress=False)
    assert policy.batches == [54]


class WindowedOracle(OraclePolicy):
    """The oracle with a bound on live episodes, counting what each call is handed."""

    def __init__(self, max_live_episodes):
        self.max_live_episodes = max_live_episodes
        self.batches = []

    async def generate(self, conversations, tools, temperature=None, **extra):
        self.batches.append(len(conversations))
        return await super().generate(conversations, tools, temperature, **extra)


def test_max_live_episodes_bounds_each_call_and_changes_no_episode():
    everything = run_rollouts(OraclePolicy(), WorldEnvironment, TASKS, k=2, progress=False)
    policy = WindowedOracle(max_live_episodes=5)
    windowed = run_rollouts(policy, WorldEnvironment, TASKS, k=2, progress=False)
    assert max(policy.batches) == 5 and sum(policy.batches) > 5
    # Every episode played, in task order, with the same steps and outcome.
    assert [t.task_id for t in windowed] == [t.task_id for t in everything]
    assert [t.messages for t in windowed] == [t.messages for t in everything]
    assert all(t.score == 1.0 for t in windowed)


class ReportingPolicy(ScriptedPolicy):
    """Hands replies over as they arrive (``reports_each_reply``), last first, and some
    twice: the engine must step each episode once, as if it had waited for them all."""

    reports_each_reply = True

    async def generate(self, conversations, tools, temperature=None, on_reply=None):
        replies = await super().generate(conversations, tools, temperature)
        for index in reversed(range(len(replies))):
            on_reply(index, replies[index])
        on_reply(0, replies[0])
        return replies


def test_replies_handed_over_early_make_the_same_episodes():
    from coevolve.agents.policy.oracle import OraclePolicy

    class ReportingOracle(OraclePolicy):
        reports_each_reply = True

        async def generate(self, conversations, tools, temperature=None, tasks=None, on_reply=None):
            replies = await super().generate(conversations, tools, temperature, tasks=tasks)
            for index in reversed(range(len(replies))):
                on_reply(index, replies[index])
            on_reply(0, replies[0])
            return replies

    plain = run_rollouts(OraclePolicy(), WorldEnvironment, TASKS, k=2, progress=False)
    early = run_rollouts(ReportingOracle(), WorldEnvironment, TASKS, k=2, progress=False)
    assert [t.model_dump() for t in early] == [t.model_dump() for t in plain]
    assert all(t.score == 1.0 for t in early)
    call = ToolCall(name="get_balance", id="c")
    [cut] = run_rollouts(
        ReportingPolicy(lambda i, c: AssistantMessage(tool_calls=[call])),
        WorldEnvironment,
        TASKS[:1],
        max_tool_calls=3,
        progress=False,
    )
    assert len(cut.steps) == 3 and not cut.finished


def test_step_limit_cuts_an_episode_off():
    call = ToolCall(name="get_balance", id="c")
    policy = ScriptedPolicy(lambda i, c: AssistantMessage(tool_calls=[call], completion_tokens=3))
    [trajectory] = run_rollouts(
        policy, WorldEnvironment, TASKS[:1], max_tool_calls=4, progress=False
    )
    assert not trajectory.finished and trajectory.error is None
    assert len(trajectory.steps) == 4 and trajectory.completion_tokens == 12


def test_unreadable_and_unknown_calls_are_steps_with_errors():
    text = '<tool_call>{"name": "find_contact", "arguments": {</tool_call><tool_call>{"name": "fly", "arguments": {}}</tool_call>'

    def reply(i, conversation):
        if len(conversation) > 2:
            return AssistantMessage(content="giving up")
        content, calls, invalid, _form = parse_assistant_text(text, read_json_calls=False)
        return AssistantMessage(
            content=content, tool_calls=calls, invalid_tool_calls=invalid, raw=text
        )

    [trajectory] = run_rollouts(ScriptedPolicy(reply), WorldEnvironment, TASKS[:1], progress=False)
    errors = sorted(step.observation.error for step in trajectory.steps)
    assert errors == ["bad_json", "unknown_tool"]
    assert trajectory.steps[0].call is None or trajectory.steps[1].call is None
    assert trajectory.messages[2] == {"role": "assistant", "content": text}  # verbatim
    assert trajectory.final_answer == "giving up" and trajectory.score == 0.0


def test_a_policy_error_ends_only_that_episode_and_keeps_its_steps():
    call = ToolCall(name="get_balance", id="c")

    def reply(i, conversation):
        if i == 0 and len(conversation) > 3:
            return AssistantMessage(error="endpoint http://x/v1 failed after 4 attempts")
        if len(conversation) > 3:
            return AssistantMessage(content="done")
        return AssistantMessage(tool_calls=[call])

    first, second = run_rollouts(ScriptedPolicy(reply), WorldEnvironment, TASKS[:2], progress=False)
    assert first.error.startswith("endpoint") and not first.finished and len(first.steps) == 1
    assert second.error is None and second.finished


class _FailingChecker(WorldEnvironment):
    """The world with a checker that raises ``error`` when it scores."""

    error: Exception = RuntimeError("checker crashed")

    def score(self):
        raise self.error


def test_a_checker_failure_is_the_episodes_error_but_a_bug_raises():
    [trajectory] = run_rollouts(OraclePolicy(), _FailingChecker, TASKS[:1], progress=False)
    assert trajectory.score == 0.0 and trajectory.steps
    assert trajectory.error == "verifier failed: RuntimeError: checker crashed"

    class Buggy(_FailingChecker):
        error = TypeError("score() got an unexpected keyword argument")

    with pytest.raises(TypeError, match="unexpected keyword"):
        run_rollouts(OraclePolicy(), Buggy, TASKS[:1], progress=False)


def test_mismatched_batch_is_an_error():
    class Broken(ScriptedPolicy):
        async def generate(self, conversations, tools, temperature=None):
            return []

    with pytest.raises(RuntimeError, match="0 messages for 1"):
        run_rollouts(Broken(None), WorldEnvironment, TASKS[:1], progress=False)


def test_evaluation_diagnostics():
    task = next(t for t in TASKS if len(t.reference_calls) == 2)
    reference = task.reference_calls
    wrong_args = ToolCall(name=reference[1].name, arguments={"x": 1})
    base = {"task_id": task.id, "env": "world", "family": task.family}
    trajectories = [
        Trajectory(id="a", score=1.0, steps=[], **base),
        Trajectory(id="b", score=0.0, **base).model_copy(
            update={"steps": [_step(reference[0]), _step(wrong_args)]}
        ),
        Trajectory(id="c", score=0.0, error="down", finished=False, **base),
    ]
    stats = evaluation_report(trajectories, [task], "world", {}, "p").by_family[task.family]
    assert stats.episodes == 3 and stats.successes == 1 and stats.errors == 1
    assert stats.tool_sequence_accuracy == pytest.approx(1 / 3)
    assert stats.call_accuracy == pytest.approx(1 / 6)


def _step(call):
    from coevolve.records import Observation, Step

    return Step(call=call, observation=Observation(text="ok"))


@pytest.mark.parametrize(
    ("text", "content", "names", "bad"),
    [
        ("The number is 555-0101.", "The number is 555-0101.", [], 0),
        ('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>', "", ["a"], 0),
        ('x<tool_call>{"name": "a"}</tool_call><tool_call>nope</tool_call>', "x", ["a"], 1),
        (
            '<tool_call>{"name": "a", "arguments": {"k": 1}}',
            "",
            ["a"],
            0,
        ),  # cut off before the close tag
    ],
)
def test_parse_assistant_text(text, content, names, bad):
    parsed_content, calls, invalid, _form = parse_assistant_text(text, read_json_calls=False)
    assert parsed_content == content and [c.name for c in calls] == names and len(invalid) == bad
    assert all(isinstance(b, InvalidToolCall) for b in invalid)
