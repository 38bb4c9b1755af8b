"""What a tool call may cost (envs/limits.py): a call past the time limit, on every path that
runs tools, becomes an observation of kind "timeout" and the run goes on; an observation past
the size limit reaches the agent cut, marked and counted, and the verifier sees it whole.

Each test runs on a copy of the support desk (examples/support_desk/env.py) with one tool
made to hang or to flood, as a user's tool that calls a service might.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coevolve.agents.policy.conversation import observations_cut, shown_observation
from coevolve.agents.policy.eval_report import evaluation_report
from coevolve.agents.policy.oracle import OraclePolicy
from coevolve.agents.policy.rollout import run_rollouts
from coevolve.cli import app
from coevolve.envs import FunctionEnvironment
from coevolve.envs.base import replay_reference
from coevolve.envs.limits import TIMEOUT, limits_set, tool_limits
from coevolve.envs.task_file import read_task_file
from coevolve.records import CandidateTask, ToolCall
from examples.support_desk.env import SupportDesk

EXAMPLE_TASKS = Path(__file__).resolve().parents[1] / "examples" / "support_desk" / "tasks.jsonl"
LIMIT_S = 0.5
# Far above LIMIT_S times the timeouts a test meets, far below the hour a hung tool takes.
BOUND_S = 30.0

# Released when the module's tests end, so no hung tool thread outlives them.
RELEASE = threading.Event()


@pytest.fixture(autouse=True, scope="module")
def _release_hung_tools():
    yield
    RELEASE.set()


class HungDesk(SupportDesk):
    """The support desk whose find_customer waits for a service that never answers."""

    def find_customer(self, email: str) -> str:
        RELEASE.wait(3600)  # as time.sleep(3600), but freed when the tests end
        return super().find_customer(email)

    find_customer.__doc__ = SupportDesk.find_customer.__doc__


class FloodingDesk(SupportDesk):
    """The support desk whose list_orders answers with 5 MB of text."""

    def list_orders(self, customer_id: str) -> str:
        return super().list_orders(customer_id) + "\n" + "x" * 5_000_000

    list_orders.__doc__ = SupportDesk.list_orders.__doc__


def example_tasks(family: str, count: int = 1):
    tasks = [t for t in read_task_file(EXAMPLE_TASKS, "desk").tasks if t.family == family]
    return tasks[:count]


def test_a_hung_tool_in_a_rollout_is_a_timeout_observation_and_the_episode_goes_on():
    [task] = example_tasks("change_plan")  # find_customer, then change_plan
    started = time.perf_counter()
    with limits_set(timeout_s=LIMIT_S):
        [trajectory] = run_rollouts(
            OraclePolicy(), lambda: FunctionEnvironment(HungDesk), [task], progress=False
        )
    assert time.perf_counter() - started < BOUND_S
    first, second = trajectory.steps
    assert first.observation.error == TIMEOUT
    assert first.observation.text == (
        f"error: find_customer did not return within the {LIMIT_S:g} s limit on a tool call "
        "(env.tool_timeout_s); its result is discarded"
    )
    # The episode went on: the next call ran on the state the calls before left.
    assert second.call.name == "change_plan" and second.observation.error is None
    report = evaluation_report([trajectory], [task], "desk", {"split": "x"}, "oracle")
    assert report.overall.call_errors == {TIMEOUT: 1} and report.overall.failed_calls == 1
    assert report.by_family["change_plan"].failed_calls == 1


def test_a_late_call_cannot_change_the_state_the_episode_goes_on_with():
    """The hung call's thread runs on; the environment answers from a state rebuilt from the
    episode's earlier calls, which the late call cannot reach."""
    release = threading.Event()

    class LateDesk(SupportDesk):
        def change_plan(self, customer_id: str, plan: str) -> str:
            release.wait(5)
            return super().change_plan(customer_id, plan)  # lands after the limit

        change_plan.__doc__ = SupportDesk.change_plan.__doc__

    [task] = example_tasks("change_plan")
    env = FunctionEnvironment(LateDesk)
    env.reset(task)
    find, change = task.reference_calls
    with limits_set(timeout_s=0.2):
        assert env.step(find).error is None
        before = env.current_state()
        assert env.step(change).error == TIMEOUT
        release.set()
        time.sleep(0.2)  # the late call finishes, on the state object it was given
        assert env.current_state() == before
        assert env.step(find).error is None  # and the tools still answer


# The user's module of a copy whose find_customer sleeps an hour (a daemon thread: it does
# not keep the test process alive).
HUNG_MODULE = """
import time
from pathlib import Path
from coevolve.envs import FunctionEnvironment
from examples.support_desk.env import SupportDesk

class HungDesk(SupportDesk):
    def find_customer(self, email: str) -> str:
        time.sleep(3600)
        return super().find_customer(email)

    find_customer.__doc__ = SupportDesk.find_customer.__doc__

def make_env():
    return FunctionEnvironment(HungDesk, tasks=Path(__file__).with_name("tasks.jsonl"))
"""


def test_env_check_reports_a_hung_tool_as_a_timeout_within_a_bounded_time(tmp_path, monkeypatch):
    lines = [json.loads(line) for line in EXAMPLE_TASKS.read_text().splitlines()]
    picked = [line for line in lines if line["id"] in ("change_plan-00", "cancel_order-00")]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(line) + "\n" for line in picked))
    name = f"hung_desk_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(HUNG_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    started = time.perf_counter()
    result = CliRunner().invoke(
        app, ["env", "check", f"{name}:make_env", "--tool-timeout", str(LIMIT_S)]
    )
    assert time.perf_counter() - started < BOUND_S
    assert result.exit_code == 2, result.output
    assert (
        'tasks.jsonl line 1 (task change_plan-00): reference call 1 find_customer(email="'
    ) in result.output
    assert f"find_customer did not return within the {LIMIT_S:g} s limit" in result.output
    assert tool_limits().timeout_s != LIMIT_S  # the option held for the command alone


def test_a_synthesis_replay_of_a_hung_tool_is_judged_within_a_bounded_time():
    from coevolve.agents.roles.judge import ExecutableJudge

    [task] = example_tasks("change_plan")
    candidate = CandidateTask(
        description="x",
        query=task.instruction,
        minimal_actions=task.reference_calls,
        setup=task.setup,
    )
    started = time.perf_counter()
    with limits_set(timeout_s=LIMIT_S):
        _, steps = replay_reference(FunctionEnvironment(HungDesk), task)
        verdict = asyncio.run(
            ExecutableJudge().judge(candidate, lambda: FunctionEnvironment(HungDesk))
        )
    assert time.perf_counter() - started < BOUND_S
    assert steps[0].observation.error == TIMEOUT and "find_customer" in steps[0].observation.text
    assert not verdict.accepted and "timeout" in verdict.reason


def test_a_5_mb_observation_reaches_the_agent_cut_marked_and_counted():
    [task] = example_tasks("refund")  # find_customer, list_orders, refund_order
    limit = tool_limits().max_observation_chars
    [trajectory] = run_rollouts(
        OraclePolicy(), lambda: FunctionEnvironment(FloodingDesk), [task], progress=False
    )
    listed = next(step for step in trajectory.steps if step.call.name == "list_orders")
    assert len(listed.observation.text) > 5_000_000  # the step, the verifier's, is whole
    tool_messages = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    [cut] = [text for text in tool_messages if "[cut:" in text]
    hidden = len(listed.observation.text) - limit
    assert cut == listed.observation.text[:limit] + f"… [cut: {hidden} more characters]"
    assert trajectory.score == 1.0  # the refund went through: the order id was in the kept part
    assert observations_cut(trajectory) == 1
    report = evaluation_report([trajectory], [task], "desk", {"split": "x"}, "oracle")
    assert report.overall.observations_cut == 1


def test_a_short_observation_is_shown_as_it_is():
    assert shown_observation("order_id=O-1 status=shipped") == "order_id=O-1 status=shipped"
    assert shown_observation("abcdef", limit=4) == "abcd… [cut: 2 more characters]"


def test_the_limits_are_settings_with_defaults_a_config_sets():
    from coevolve.config import load_config

    with limits_set():
        config = load_config({"env": {"tool_timeout_s": 2.5, "max_observation_chars": 900}})
        assert (config.env.tool_timeout_s, config.env.max_observation_chars) == (2.5, 900)
        assert (tool_limits().timeout_s, tool_limits().max_observation_chars) == (2.5, 900)
    defaults = load_config({}).env
    assert (defaults.tool_timeout_s, defaults.max_observation_chars) == (10.0, 4000)


def test_an_environment_of_the_users_own_step_is_bounded_too(tmp_path, monkeypatch):
    """One that is not a ToolEnvironment: its step is bounded from outside, and after a late
    call its tools answer nothing more that episode (it cannot say what the call changed)."""
    from coevolve.envs.user_env import UserEnvironment

    class OwnStep:
        name = "own"

        def __init__(self):
            self.inner = FunctionEnvironment(SupportDesk)

        def __getattr__(self, attribute):
            return getattr(self.inner, attribute)

        def step(self, action):
            # The hang is in this step itself: a FunctionEnvironment's own bound (the same
            # limit) around a hung tool would race the outer one.
            if action.name == "find_customer":
                RELEASE.wait(3600)
            return self.inner.step(action)

        def reset(self, task):
            return self.inner.reset(task)

    (tmp_path / "tasks.jsonl").write_text(EXAMPLE_TASKS.read_text().splitlines()[8] + "\n")
    found = UserEnvironment("own", OwnStep, tmp_path / "tasks.jsonl", "own", "own")
    env = found.make_env()
    [task] = example_tasks("change_plan")
    env.reset(task)
    find = ToolCall(name="find_customer", arguments={"email": "x@mail.com"})
    with limits_set(timeout_s=0.2):
        assert env.step(find).error == TIMEOUT
        stopped = env.step(find)
        assert stopped.error == TIMEOUT and "stopped for the rest of this episode" in stopped.text
        env.reset(task)
        assert env.step(ToolCall(name="cancel_order", arguments={"order_id": "O-1"})).error != (
            TIMEOUT
        )


def test_a_run_or_resume_on_a_still_hung_tool_is_refused_in_bounded_time(tmp_path, monkeypatch):
    """`coevolve run` and `--resume` load the config, which replays every reference under the
    config's own limit: a tool still hung is refused with the tool named, not waited for."""
    from coevolve.common.config_base import ConfigError
    from coevolve.config import load_config

    lines = [json.loads(line) for line in EXAMPLE_TASKS.read_text().splitlines()]
    picked = [line for line in lines if line["id"] == "change_plan-00"]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(line) + "\n" for line in picked))
    name = f"hung_desk_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(HUNG_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    started = time.perf_counter()
    with limits_set(), pytest.raises(ConfigError) as refused:
        load_config({"env": {"name": f"{name}:make_env", "tool_timeout_s": LIMIT_S}})
    assert time.perf_counter() - started < BOUND_S
    assert f"find_customer did not return within the {LIMIT_S:g} s limit" in str(refused.value)
