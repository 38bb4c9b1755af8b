"""An endpoint that is down is not an agent that failed, and one run directory holds one
live run (issue 62).

Every endpoint here is the project's scripted server over real HTTP: one that refuses
from the start (a port where nothing listens), one that dies mid-rollout, one that fails
one request in ten (by a hash of the request, so the same requests fail in every run).
The loop's policy is a *reference agent* behind the server (testing/reference_agent.py),
trained on the tiny model, as in tests/test_cycle.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from coevolve.agents.policy.eval_report import evaluation_report
from coevolve.agents.policy.rollout import run_rollouts
from coevolve.envs.world import load_split
from coevolve.envs.world.env import WorldEnvironment
from coevolve.testing.openai_server import Reply, ScriptedOpenAIServer
from coevolve.testing.presets import endpoint_run
from coevolve.testing.reference_agent import reference_replies

TASKS = load_split("train") + load_split("heldout")


def broken(task_id: str) -> bool:
    """A third of the tasks answered wrong on purpose, so runs fail as well as succeed."""
    return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % 3 == 0


AGENT = reference_replies(TASKS, wrong=broken)


def one_in_ten_fails(body: dict[str, Any]) -> Reply:
    """The reference agent, but one request in ten (by its content: the same requests in
    every run) answered 503."""
    # The conversation's text, without the call ids the server draws at random.
    text = json.dumps(
        [
            (m["role"], m.get("content"), [c["function"] for c in m.get("tool_calls") or []])
            for m in body["messages"]
        ],
        sort_keys=True,
    )
    digest = hashlib.sha256(text.encode()).digest()
    return Reply.status(503, "overloaded") if digest[0] % 10 == 0 else AGENT(body)


def free_port() -> int:
    """A port nothing listens on (connections to it are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_config(run_dir: Path, base_url: str, model_dir: Path, **changes: Any) -> dict:
    """One cycle of the loop on the endpoint, retrying fast (these servers fail on purpose)."""
    config = endpoint_run(
        run_dir,
        base_url,
        "scripted-model",
        model_dir,
        cycles=1,
        pool={"synthesized_weight": 100.0},
        signals={"rare_theta_percent": 10},
    )
    config["endpoints"]["agent"].update(max_retries=1, retry_base_s=0.01, retry_max_s=0.02)
    for section, values in changes.items():
        config.setdefault(section, {}).update(values)
    return config


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coevolve", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "400"},
    )


def error_line(stderr: str) -> str:
    """The one line a command ended on."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), stderr[-3000:]
    return lines[-1]


# --------------------------------------------------------------------------- episodes


def endpoint_policy(base_url: str):
    from coevolve.agents.policy.endpoint_policy import EndpointPolicy
    from coevolve.config import EndpointConfig

    endpoint = EndpointConfig(base_url=base_url, model="scripted-model", max_retries=1)
    return EndpointPolicy(endpoint, retry_base_s=0.01, retry_max_s=0.02)


def test_an_endpoint_that_gives_no_reply_marks_the_episode_a_transport_failure(
    tmp_path, scripted_server
):
    tasks = load_split("heldout")[:3]
    down = run_rollouts(
        endpoint_policy(f"http://127.0.0.1:{free_port()}/v1"), WorldEnvironment, tasks
    )
    assert all(t.transport_failure and t.score == 0.0 for t in down)
    assert "connection error" in (down[0].error or "")
    report = evaluation_report(down, tasks, "world", {"split": "heldout"}, "agent")
    assert (report.overall.episodes, report.overall.left_out) == (0, 3)
    assert report.overall.success_rate == 0.0

    # `coevolve synthesize` on saved episodes flags none of them.
    saved = tmp_path / "down.jsonl"
    saved.write_text("".join(t.model_dump_json() + "\n" for t in down))
    synthesized = cli("synthesize", str(saved), timeout=120)
    assert synthesized.returncode == 1
    assert "no trajectory got a reply from the endpoint" in error_line(synthesized.stderr)

    # A request the server refuses (a 4xx) got a reply: the agent's failure, counted.
    refused = scripted_server([Reply.status(400, "context too long")], repeat_last=True)
    rejected = run_rollouts(endpoint_policy(refused.base_url), WorldEnvironment, tasks[:1])
    assert rejected[0].error and not rejected[0].transport_failure


def test_eval_with_the_endpoint_down_exits_non_zero_in_one_line(tmp_path):
    port = free_port()
    config = tmp_path / "down.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "policy": {"kind": "endpoint", "endpoint": "agent"},
                "endpoints": {
                    "agent": {
                        "base_url": f"http://127.0.0.1:{port}/v1",
                        "model": "scripted-model",
                        "max_retries": 0,
                    }
                },
            }
        )
    )
    result = cli("eval", "--policy", str(config), "--limit", "1")
    assert result.returncode == 1, result.stderr[-3000:]
    line = error_line(result.stderr)
    assert f"http://127.0.0.1:{port}/v1" in line and "'scripted-model'" in line
    assert "none got a usable reply" in line and "connection error" in line
    assert result.stdout.strip() == ""  # no table of zeros


def test_eval_with_one_request_in_ten_failing_reports_over_the_episodes_that_ran(
    tmp_path, scripted_server
):
    server = scripted_server(one_in_ten_fails)
    config = tmp_path / "flaky.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "policy": {"kind": "endpoint", "endpoint": "agent"},
                "endpoints": {
                    "agent": {"base_url": server.base_url, "model": server.model, "max_retries": 0}
                },
            }
        )
    )
    result = cli("eval", "--policy", str(config), "--limit", "18", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    overall = json.loads(result.stdout)["overall"]
    # An episode makes several requests: one in ten failing loses about a third of them.
    assert overall["left_out"] > 0 and overall["episodes"] > 0
    assert overall["episodes"] + overall["left_out"] == 18
    # The rate is over the episodes that ran.
    rate = overall["successes"] / overall["episodes"]
    assert overall["success_rate"] == pytest.approx(rate, abs=1e-4)
    assert overall["errors"] == 0


# --------------------------------------------------------------------------- the loop


def test_a_run_with_its_endpoint_refusing_stops_in_one_line_before_any_stage_learns(
    tmp_path, tiny_build
):
    port = free_port()
    run_dir = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(run_config(run_dir, f"http://127.0.0.1:{port}/v1", tiny_build))
    )
    result = cli("run", str(config))
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    line = error_line(result.stderr)
    assert line.startswith("error: cycle 0 · evaluate: of ")
    assert f"endpoint http://127.0.0.1:{port}/v1 (model 'scripted-model')" in line
    assert "connection error" in line
    assert line.endswith(f"continue it with: coevolve run --resume {shlex.quote(str(run_dir))}")
    # Nothing learnt from the episodes: no rollout, signal, synthesis, training or figures.
    assert not (run_dir / "cycles" / "001").exists()
    assert not (run_dir / "history.jsonl").exists() or not (run_dir / "history.jsonl").read_text()
    assert not (run_dir / "metrics.jsonl").exists()
    assert not (run_dir / "run.lock").exists()  # the lock goes with the run


class DyingServer:
    """The reference agent until ``after`` rollout requests (temperature > 0: the
    evaluation is greedy) have come, then the server stops: connections are dropped,
    then refused."""

    def __init__(self, after: int):
        self.after = after
        self.rollout_requests = 0
        self.lock = threading.Lock()
        self.server = ScriptedOpenAIServer(self.reply)

    def reply(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            if body.get("temperature", 0) > 0:
                self.rollout_requests += 1
            dies = self.rollout_requests == self.after
            dead = self.rollout_requests >= self.after
        if dies:
            threading.Thread(target=self.server.stop, daemon=True).start()
        return Reply.drop() if dead else AGENT(body)


def _figures(run_dir: Path) -> tuple[list[str], list[dict]]:
    pool = [
        json.loads(line)["id"]
        for line in (run_dir / "synthesized_tasks.jsonl").read_text().splitlines()
    ]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sorted(pool), metrics


def test_a_server_that_dies_mid_rollout_stops_the_run_and_a_resume_matches_an_unbroken_run(
    tmp_path, tiny_build
):
    dying = DyingServer(after=6)
    dying.server.start()
    port = dying.server.port
    base_url = dying.server.base_url
    run_dir = tmp_path / "stopped"
    config = tmp_path / "stopped.yaml"
    config.write_text(yaml.safe_dump(run_config(run_dir, base_url, tiny_build)))
    try:
        stopped = cli("run", str(config))
    finally:
        dying.server.stop()
    assert stopped.returncode == 1, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    line = error_line(stopped.stderr)
    assert line.startswith("error: cycle 1 · rollout: of 48 episodes ")
    assert f"endpoint {base_url} (model 'scripted-model')" in line
    assert "cycle 0 · evaluate" in stopped.stdout  # the baseline finished before the server died
    # The rollout stage wrote nothing: no later stage saw its episodes.
    assert not (run_dir / "cycles" / "001").exists()
    assert not (run_dir / "metrics.jsonl").exists()
    resume_command = line.split("continue it with: ", 1)[1]
    assert resume_command == f"coevolve run --resume {shlex.quote(str(run_dir))}"

    # The server comes back on the same address; the stopped run resumes with the command
    # it was given, and ends where a run that never lost the server ends.
    with ScriptedOpenAIServer(AGENT, port=port) as back:
        assert back.base_url == base_url
        straight_dir = tmp_path / "straight"
        straight_config = tmp_path / "straight.yaml"
        straight_config.write_text(yaml.safe_dump(run_config(straight_dir, base_url, tiny_build)))
        straight = cli("run", str(straight_config))
        assert straight.returncode == 0, straight.stderr[-3000:]
        resumed = cli(*shlex.split(resume_command)[1:])
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming" in resumed.stdout and "cycle 0 ·" not in resumed.stdout
    pool, metrics = _figures(run_dir)
    straight_pool, straight_metrics = _figures(straight_dir)
    assert pool == straight_pool
    keys = ("heldout_success", "rollout_success", "rollout_episodes", "train_examples")
    assert [[m[k] for k in keys] for m in metrics] == [
        [m[k] for k in keys] for m in straight_metrics
    ]
    assert all(m["rollout_left_out"] in (None, 0) for m in metrics)


def test_one_request_in_ten_failing_trains_only_on_episodes_that_got_their_replies(
    tmp_path, tiny_build, scripted_server
):
    from coevolve.run_files import CycleFiles
    from coevolve.runner import run

    server = scripted_server(one_in_ten_fails)
    config = run_config(
        tmp_path / "run",
        server.base_url,
        tiny_build,
        rollout={"max_unreachable_share": 0.6},
    )
    config["endpoints"]["agent"]["max_retries"] = 0  # a failed request stays failed
    result = run(config, progress=False)
    rollout = result.cycles[1].rollout
    assert rollout is not None and rollout.left_out > 0
    assert rollout.episodes + rollout.left_out == rollout.tasks * 2
    files = CycleFiles(result.run_dir, 1)
    ran, lost = files.rollouts(), files.unreachable("rollout")
    assert len(ran) == rollout.episodes and len(lost) == rollout.left_out
    assert not any(t.transport_failure for t in ran) and all(t.transport_failure for t in lost)
    # Only episodes that ran are flagged, recorded in the history, or trained on.
    lost_ids = {t.id for t in lost}
    assert not lost_ids & {item.trajectory.id for item in files.flagged()}
    history = (Path(result.run_dir) / "history.jsonl").read_text().splitlines()
    recorded = {json.loads(line)["trajectory_id"] for line in history}
    assert recorded == {t.id for t in ran}
    # Training reads rollouts.jsonl (GRPO's groups and DPO's pairs too): its figures
    # count the episodes that ran, and the run trained.
    assert result.cycles[1].train is not None and result.cycles[1].train.steps > 0
    # The figures name what they left out.
    baseline = result.cycles[0].evaluate
    assert baseline is not None and baseline.left_out > 0
    metrics = [json.loads(line) for line in Path(result.metrics).read_text().splitlines()]
    assert metrics[1]["rollout_left_out"] == rollout.left_out
    assert metrics[0]["heldout_left_out"] == baseline.left_out


# --------------------------------------------------------------------------- the lock

HOLDER = """
import sys, time
from coevolve.loop.run_lock import hold_run_dir

with hold_run_dir(sys.argv[1]):
    print("holding", flush=True)
    time.sleep(600)
"""


def test_a_second_run_on_a_live_runs_directory_is_refused_and_a_dead_ones_lock_taken_over(
    tmp_path,
):
    from coevolve.loop.run_lock import hold_run_dir
    from coevolve.run_files import LOCK_FILE
    from coevolve.runner import RunError, resume, run

    run_dir = tmp_path / "run"
    config = {"run_dir": str(run_dir), "cycles": 1}
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "checkpoints.sqlite").write_text("")  # a run's files, which must survive
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        named = rf"{run_dir} is in use by a live run \(pid {holder.pid} on {socket.gethostname()}"
        with pytest.raises(RunError, match=named):
            run(config, progress=False)
        with pytest.raises(RunError, match=named):
            run(config, overwrite=True, progress=False)
        with pytest.raises(RunError, match=named):
            resume(run_dir, progress=False)
        assert (run_dir / "checkpoints.sqlite").exists()  # --overwrite deleted nothing

        refused = cli("run", "--resume", str(run_dir), timeout=120)
        assert refused.returncode != 0
        assert f"pid {holder.pid}" in error_line(refused.stderr)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)

    # The killed holder's lock file is still there, naming it; the next run takes it over.
    assert f'"pid":{holder.pid}' in (run_dir / LOCK_FILE).read_text()
    said: list[str] = []
    with hold_run_dir(run_dir, say=said.append):
        assert f'"pid":{os.getpid()}' in (run_dir / LOCK_FILE).read_text()
    assert said and f"pid {holder.pid}" in said[0]
    assert not (run_dir / LOCK_FILE).exists()


def test_the_lock_refuses_a_second_holder_in_the_same_process(tmp_path):
    from coevolve.loop.run_lock import hold_run_dir
    from coevolve.runner import RunError

    with hold_run_dir(tmp_path), pytest.raises(RunError, match=f"pid {os.getpid()}"):
        with hold_run_dir(tmp_path):
            pass
    with hold_run_dir(tmp_path):  # released: free again
        pass


def test_the_run_summary_names_the_episodes_left_out():
    from rich.console import Console

    from coevolve.outputs.report import print_summary
    from coevolve.outputs.summary import CycleSummary, EvaluationFigures, RolloutFigures

    evaluation = EvaluationFigures(
        success=0.5, tool_sequence=0.5, calls=0.5, episodes=16, left_out=2, time_s=1.0
    )
    rollout = RolloutFigures(
        tasks=8, seed_tasks=8, synthesized_tasks=0, episodes=13, left_out=3, success=0.5, time_s=1
    )
    cycles = [
        CycleSummary(cycle=0, evaluate=evaluation),
        CycleSummary(cycle=1, rollout=rollout, evaluate=evaluation),
    ]
    console = Console(record=True, width=200)
    print_summary(console, cycles)
    assert (
        "episodes left out (no reply from the endpoint; in no rate above): cycle 0: 2 held-out; "
        "cycle 1: 3 rollout, 2 held-out" in console.export_text()
    )
