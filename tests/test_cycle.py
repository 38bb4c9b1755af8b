"""The closed loop end to end: the cycle graph, the runner, kill-and-resume, the CLI.

Two policies drive it:
- the tiny bootstrap model in-process (what a laptop runs; it learns nothing in
  a test's budget, so these tests check the machinery, not the scores);
- a *reference agent* behind the local OpenAI-compatible test server (real
  HTTP): it answers each request with the next reference call of the task whose
  request it recognises, and gets a third of the tasks wrong on purpose. Its
  answers depend only on the conversation, so runs are reproducible, rollouts
  succeed and fail, the rare signal fires and synthesis has material; adapters
  are trained on the tiny model and hot-loaded into the server through vLLM's
  LoRA API.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from coevolve.envs.world import load_split
from coevolve.memory.store import TaskStore
from coevolve.testing.presets import endpoint_run, tiny_bootstrap, tiny_cycle
from coevolve.testing.reference_agent import reference_replies

TINY = tiny_bootstrap()
ROOT = Path(__file__).resolve().parents[1]


def broken(task_id: str) -> bool:
    return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % 3 == 0


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory):
    from coevolve.testing.openai_server import ScriptedOpenAIServer

    tasks = load_split("train") + load_split("heldout")
    server = ScriptedOpenAIServer(reference_replies(tasks, wrong=broken)).start()
    yield server
    server.stop()


def endpoint_config(run_dir: Path, server, model_dir: Path, cycles: int = 2) -> dict:
    return endpoint_run(
        run_dir,
        server.base_url,
        server.model,
        model_dir,
        cycles=cycles,
        pool={"synthesized_weight": 100.0},
        signals={"rare_theta_percent": 10},
    )


def test_one_cycle_on_the_tiny_model_in_process(tmp_path, cache_dir, tiny_build, monkeypatch):
    from coevolve.config import CoevolveConfig
    from coevolve.runner import run

    monkeypatch.setenv("COEVOLVE_CACHE", str(cache_dir))
    # SEAL's diagnosis weights on the SFT examples (checked below).
    seal = {"seal": {"reweight": {"enable": True}}}
    config = CoevolveConfig.model_validate(tiny_cycle(tmp_path / "run", training=seal))
    result = run(config.model_copy(update={"bootstrap": TINY}), progress=False)

    from coevolve.outputs.summary import RunSummary

    run_dir = Path(result.run_dir)
    assert [c.cycle for c in result.cycles] == [0, 1]
    baseline, first = result.cycles
    assert baseline.rollout is None and baseline.train is None and baseline.time_s
    assert first.rollout and first.signals and first.synthesize and first.pool and first.train
    assert first.rollout.episodes == 12
    assert first.evaluate.episodes == 18  # one held-out task per family
    assert first.train.algorithm == "sft" and first.train.steps == 2
    # summary.json holds the same summaries, under the keys it always had.
    saved = json.loads((run_dir / "summary.json").read_text())
    assert set(saved["cycles"][0]) == {"cycle", "evaluate", "time_s"}
    assert set(saved["cycles"][1]) == {
        *("cycle", "rollout", "signals", "synthesize", "pool", "train", "evaluate")
    }
    assert saved["cycles"][1]["train"]["stage_time_s"] == first.train.stage_time_s
    reread = RunSummary.model_validate_json((run_dir / "summary.json").read_text())
    assert reread.cycles == result.cycles and reread.pool == result.pool
    assert result.adapter == str(run_dir / "adapters" / "cycle-1")
    assert (run_dir / "adapters" / "cycle-1" / "adapter_config.json").exists()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["cycle"] for row in rows] == [0, 1]
    assert rows[1]["stage_time_s"].keys() >= {"rollout", "train", "evaluate"}
    # the rows report.png plots and summary.json hold the cycles' own figures
    assert [row["heldout_success"] for row in rows] == result.success_by_cycle()
    assert rows[1]["train_steps"] == 2 and rows[1]["train_loss"] == first.train.final_loss
    assert Path(result.report).stat().st_size > 10_000  # a real PNG with six panels
    # the trainer's log dicts went to the run's log file (the terminal stays clean)
    assert "coevolve.trainer INFO: step 1: {'loss'" in (run_dir / "run.log").read_text()
    # Where the flags land: counts by kind before and after the budget, per family.
    signals = first.signals
    assert set(signals.by_kind) == {"forgetting", "boundary", "rare", "unsolved"}
    assert signals.kept <= signals.flagged
    assert sum(row.kept_items for row in signals.by_family.values()) == signals.kept
    assert signals.flag_precision is not None and 0.0 <= signals.flag_precision <= 1.0
    assert rows[1]["flags_by_family"] == saved["cycles"][1]["signals"]["by_family"]
    assert rows[1]["stage_time_s"]["train"] == first.train.stage_time_s
    # Each kept item carries its task's nearest miss when another failed episode got further.
    kept = [json.loads(line) for line in (run_dir / "cycles" / "001" / "flagged.jsonl").open()]
    linked = [item for item in kept if item["nearest_miss"] is not None]
    assert signals.nearest_misses == len(linked)
    for item in linked:
        miss, own = item["nearest_miss"], item["trajectory"]
        assert miss["task_id"] == own["task_id"] and miss["score"] < 1.0
        assert miss["progress"] > own["progress"]
    # coevolve export: the synthesized tasks with provenance, and the cycle's SFT examples.
    from datasets import load_dataset

    from coevolve.outputs.export import export_run

    counts = export_run(run_dir, tmp_path / "export-hf", "hf")
    exported = {
        name: load_dataset(str(tmp_path / "export-hf"), name, split="train") for name in counts
    }
    assert counts["sft"] == exported["sft"].num_rows == first.train.examples
    assert set(exported["sft"]["cycle"]) == {1}
    assert exported["sft"][0]["messages"][0]["role"] == "system"
    if "tasks" in counts:
        task = exported["tasks"][0]
        assert task["source"] == "synthesized" and task["cycle"] == 1 and task["parent_task_id"]
        assert json.loads(task["turns"])[0]["query"] == task["instruction"]
    out = subprocess.run(
        [sys.executable, "-m", "coevolve", "export", str(run_dir), str(tmp_path / "x"), "--json"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and json.loads(out.stdout) == counts, out.stderr
    assert (tmp_path / "x" / "sft.jsonl").read_text().count("\n") == counts["sft"]
    # Demonstrations of tasks synthesized from a diagnosed failure carry its SEAL weight.
    weights = [
        json.loads(line)["weight"]
        for line in (run_dir / "cycles" / "001" / "train_data.jsonl").open()
    ]
    assert len(weights) == counts["sft"] and all(0.5 <= w <= 2.0 for w in weights)
    if first.synthesize.accepted:
        assert any(w != 1.0 for w in weights)
    # SEAL's diagnosis labels every rollout (at least its outcome) and is counted per cycle.
    assert sum(first.rollout.diagnosis.values()) >= first.rollout.episodes
    trajectories = (run_dir / "cycles" / "001" / "eval.jsonl").read_text().splitlines()
    assert {json.loads(t)["policy_version"] for t in trajectories} != {"bootstrap"}


def test_hard_negatives_run_on_an_endpoint_policy(tmp_path, agent_server, tiny_build):
    """The failure agent rolls out through the endpoint too (a sibling policy; in cycle 1
    still the base model), and the target's DPO + SFT adapter is hot-loaded."""
    from coevolve.runner import run

    config = endpoint_config(tmp_path / "run", agent_server, tiny_build, cycles=1)
    config["hard_negatives"] = {"enabled": True}
    before = len(agent_server.requests)
    result = run(config, progress=False)

    run_dir = Path(result.run_dir)
    failure = [
        json.loads(line) for line in (run_dir / "cycles" / "001" / "failure_rollouts.jsonl").open()
    ]
    assert failure and all(t["policy_version"] == "failure:base" for t in failure)
    figures = json.loads((run_dir / "cycles" / "001" / "hard_negatives.json").read_text())
    assert figures["failure_agent"]["episodes"] == len(failure)
    assert result.cycles[1].train.algorithm == "dpo"
    model = agent_server.model
    routes = [
        (r.path, r.body.get("lora_name"))
        for r in agent_server.requests[before:]
        if "lora" in r.path
    ]
    assert routes == [("/v1/load_lora_adapter", f"{model}-coevolve-cycle-1")]


def test_cycles_with_an_endpoint_policy_grow_the_pool_and_hot_load_adapters(
    tmp_path, agent_server, tiny_build
):
    from coevolve.runner import run

    result = run(endpoint_config(tmp_path / "run", agent_server, tiny_build), progress=False)

    first, second = result.cycles[1], result.cycles[2]
    assert first.rollout and first.signals and first.synthesize and first.pool and first.train
    assert second.rollout and second.pool
    # The reference agent gets two thirds of the tasks right: the cycle has both outcomes.
    assert 0.3 < first.rollout.success < 0.95
    assert first.signals.by_kind["rare"] > 0
    assert first.synthesize.accepted > 0
    assert result.pool["synthesized"] == first.pool.added + second.pool.added
    assert second.rollout.synthesized_tasks > 0  # cycle 2 rolls out synthesized tasks
    # Both adapters were trained on the local model and served by name through vLLM's API.
    routes = [(r.path, r.body.get("lora_name")) for r in agent_server.requests if "lora" in r.path]
    model = agent_server.model
    assert routes[-3:] == [
        ("/v1/load_lora_adapter", f"{model}-coevolve-cycle-1"),
        ("/v1/load_lora_adapter", f"{model}-coevolve-cycle-2"),
        ("/v1/unload_lora_adapter", f"{model}-coevolve-cycle-1"),
    ]
    evaluated = [
        r.body.get("model") for r in agent_server.requests if r.path.endswith("/completions")
    ]
    assert evaluated[-1] == f"{model}-coevolve-cycle-2"
    tasks = [json.loads(line) for line in Path(result.tasks).read_text().splitlines()]
    assert tasks and all(t["source"] == "synthesized" and t["parent_task_id"] for t in tasks)
    assert {t["cycle"] for t in tasks} <= {1, 2} and all(t["signal"] for t in tasks)

    # A synthesis stage that runs again (after a kill between its store writes and its
    # checkpoint) first takes its cycle's tasks out of the store: same tasks, no duplicates.
    import asyncio

    from coevolve.config import load_config
    from coevolve.runner import build_runtime

    rt = build_runtime(load_config(Path(result.run_dir) / "config.yaml"), progress=False)
    try:
        stored = rt.store.count()
        from coevolve.outputs.summary import SynthesisFigures

        again = asyncio.run(_synthesize_again(rt, cycle=1))
        redone = SynthesisFigures.model_validate(again["synthesize"])
        assert redone.removed_on_resume == first.pool.added
        assert redone.accepted == first.synthesize.accepted
        assert rt.store.count() == stored
        synthesized = Path(result.run_dir) / "cycles" / "001" / "synthesized.jsonl"
        assert len(synthesized.read_text().splitlines()) == first.synthesize.accepted

        # Killed after the adapter was saved but before the cycle's record: not trained again.
        from coevolve.graph.cycle.stages import pool_sample
        from coevolve.runner import train_cycle

        record = Path(result.run_dir) / "cycles" / "001" / "train.json"
        weights = Path(result.run_dir) / "adapters" / "cycle-1" / "adapter_model.safetensors"
        before = (record.read_text(), weights.stat().st_mtime_ns)
        record.unlink()
        files = rt.files(1)
        sample = pool_sample(rt, 1, files.synthesized())
        again_trained = asyncio.run(
            train_cycle(rt, 1, None, files.rollouts(), files.flagged(), sample)
        )
        assert again_trained.steps == first.train.steps
        assert (record.read_text(), weights.stat().st_mtime_ns) == before
    finally:
        rt.store.close()


async def _synthesize_again(rt, cycle: int) -> dict:
    """The cycle graph's synthesis stage once more (synthesize, the synthesis subgraph,
    record_synthesis), as a resumed run would run it; returns the cycle's figures."""
    from langgraph.checkpoint.memory import InMemorySaver

    from coevolve.graph.cycle.graph import builder

    compiled: Any = builder.compile(
        checkpointer=InMemorySaver(), interrupt_after=["record_synthesis"]
    )
    thread: Any = {"configurable": {"thread_id": "again"}}
    await compiled.aupdate_state(thread, {"cycle": cycle, "cycles": cycle}, as_node="signals")
    await compiled.ainvoke(None, thread, context=rt)
    state = await compiled.aget_state(thread)
    assert state.next == ("update_pool",)
    assert not state.values["flagged"] and not state.values["accepted"]  # emptied again
    return state.values["current"]


RUNNER = textwrap.dedent(
    """
    import sys
    from coevolve.runner import resume, run
    from rich.console import Console

    console = Console(force_terminal=False, width=200)
    if sys.argv[1] == "resume":
        resume(sys.argv[2], progress=False, console=console)
    else:
        run(sys.argv[2], progress=False, console=console)
    print("RUN FINISHED", flush=True)
    """
)


def _final_state(run_dir: Path) -> tuple[list[str], list[str], list[dict]]:
    pool = [
        json.loads(line)["id"]
        for line in (run_dir / "synthesized_tasks.jsonl").read_text().splitlines()
    ]
    with TaskStore(str(run_dir / "task_store")) as store:
        stored = [t.id for t in store.all_tasks() if t.source == "synthesized"]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return pool, stored, metrics


def test_a_killed_run_resumes_without_redoing_or_duplicating(tmp_path, agent_server, tiny_build):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)

    def config_file(name: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(endpoint_config(tmp_path / name, agent_server, tiny_build)))
        return path

    straight = subprocess.run(
        [sys.executable, str(script), "run", str(config_file("straight"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "RUN FINISHED" in straight.stdout, straight.stderr[-3000:]

    # Kill the second run in cycle 2, once cycle 2's synthesis has started.
    process = subprocess.Popen(
        [sys.executable, str(script), "run", str(config_file("killed"))],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    assert process.stdout is not None
    for line in process.stdout:
        seen.append(line)
        if line.startswith("cycle 2 · signals"):
            process.send_signal(signal.SIGKILL)
            break
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, "".join(seen)[-3000:]
    killed_dir = tmp_path / "killed"
    assert not (killed_dir / "metrics.jsonl").exists()

    # Strict, as langgraph means to make the default: a class the checkpoint holds and
    # the runner's serializer does not name is refused on reading it back.
    resumed = subprocess.run(
        [sys.executable, str(script), "resume", str(killed_dir)],
        env={**env, "LANGGRAPH_STRICT_MSGPACK": "true"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "RUN FINISHED" in resumed.stdout, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    said = resumed.stdout + resumed.stderr + (killed_dir / "run.log").read_text()
    assert "Blocked deserialization" not in said and "unregistered type" not in said, said[-3000:]
    # It continues in cycle 2 after the rollout (signals, if the kill beat their
    # checkpoint); nothing finished is run again.
    assert "resuming" in resumed.stdout and "cycle 2, next stage" in resumed.stdout
    assert "cycle 1 ·" not in resumed.stdout
    assert "cycle 2 · rollout" not in resumed.stdout

    pool, stored, metrics = _final_state(killed_dir)
    straight_pool, _straight_stored, straight_metrics = _final_state(tmp_path / "straight")
    assert len(pool) == len(set(pool)) and len(stored) == len(set(stored))
    assert sorted(pool) == sorted(stored)
    assert sorted(pool) == sorted(straight_pool)
    assert [m["heldout_success"] for m in metrics] == [
        m["heldout_success"] for m in straight_metrics
    ]


def test_resuming_a_finished_run_only_reports(tmp_path, agent_server, tiny_build):
    from coevolve.runner import RunError, resume, run

    config = endpoint_config(tmp_path / "run", agent_server, tiny_build, cycles=1)
    config["pool"]["rollout_tasks"] = 6
    first = run(config, progress=False)
    requests = len(agent_server.requests)
    again = resume(tmp_path / "run", progress=False)
    assert again.cycles == first.cycles
    assert len(agent_server.requests) == requests
    with pytest.raises(RunError, match=r"already holds a run.*--resume"):
        run(config, progress=False)


def test_cli_run_reports_bad_configs_clearly(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cycles: 2\ntraining:\n  algoritm: sft\n")
    out = subprocess.run(
        [sys.executable, "-m", "coevolve", "run", str(bad)], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "training.algoritm" in out.stderr and "did you mean 'algorithm'" in out.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "coevolve", "run", "--resume", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "holds no run to resume" in missing.stderr
    endpoint_without_model = tmp_path / "endpoint.yaml"
    endpoint_without_model.write_text(
        "policy:\n  kind: endpoint\n  endpoint: {base_url: 'http://127.0.0.1:9/v1', model: m}\n"
        f"run_dir: {tmp_path / 'e'}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "coevolve", "run", str(endpoint_without_model)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "policy.train_model" in out.stderr


def test_the_cycle_graph_is_exported_for_studio():
    from coevolve.graph.cycle.graph import builder, graph

    assert set(graph.get_graph().nodes) >= {
        "baseline",
        "rollout",
        "signals",
        "synthesize",
        "synthesis",
        "record_synthesis",
        "update_pool",
        "train",
        "evaluate",
    }
    # Synthesis is a subgraph node: Studio (xray) draws its nodes and each branch's roles.
    drawn = graph.get_graph(xray=True)
    assert {
        "synthesis:prepare",
        "synthesis:branch:summarize",
        "synthesis:branch:explore",
        "synthesis:branch:abstract",
        "synthesis:branch:judge",
        "synthesis:dedup",
    } <= set(drawn.nodes)
    edges = {(e.source, e.target) for e in drawn.edges}
    assert {
        ("synthesize", "synthesis:prepare"),
        ("synthesis:dedup", "record_synthesis"),
        ("record_synthesis", "update_pool"),
    } <= edges
    assert graph.checkpointer is None and builder.compile().checkpointer is None
    spec = json.loads((ROOT / "langgraph.json").read_text())
    assert spec["graphs"] == {
        "cycle": "coevolve.loop.studio:cycle",
        "synthesis": "coevolve.loop.studio:synthesis",
    }


def test_studio_factories_show_a_form_and_bind_the_runtime_built_from_it() -> None:
    """To draw, Studio gets the graph and its context form; to run, the graph bound to the
    runtime its JSON context builds; a context that is not the form fails naming its fields."""
    from langgraph_sdk.runtime import _ExecutionRuntime, _ReadRuntime

    from coevolve.graph.synthesis.context import SynthesisRuntime
    from coevolve.loop import studio

    reading = studio.cycle(_ReadRuntime(access_context="assistants.read", store=None))
    assert reading.bound_context is None
    form = reading.get_context_jsonschema()
    assert form["properties"]["config"]["default"] == "configs/quickstart.yaml"
    assert "synthesis:prepare" in reading.get_graph(xray=True).nodes
    running = studio.synthesis(
        _ExecutionRuntime(access_context="threads.create_run", store=None, context={"env": "world"})
    )
    assert isinstance(running.bound_context, SynthesisRuntime)
    assert running.bound_context.roles.names()["judge"] == "judge:offline"
    assert running.bound_context.roles.names()["synthesizer"] == "variation"  # the default
    # The server copies the graph it gets (checkpointer, store): the binding survives.
    assert running.copy({"checkpointer": None}).bound_context is running.bound_context
    with pytest.raises(ValueError, match="the fields env, synthesizer, roles, endpoints"):
        studio.synthesis(
            _ExecutionRuntime(
                access_context="threads.create_run", store=None, context={"config": "x.yaml"}
            )
        )


def test_evaluation_every_skips_the_cycles_between_and_keeps_the_last(
    tmp_path, agent_server, tiny_build
):
    """evaluation.every = 2 over 2 cycles: cycle 0 and the last are evaluated, cycle 1 not;
    the summary, metrics and report say so instead of showing a 0."""
    import math

    from coevolve.runner import run

    config = endpoint_config(tmp_path / "run", agent_server, tiny_build)
    config["evaluation"] = {**config["evaluation"], "every": 2}
    config["synthesis"] = {**config["synthesis"], "enabled": False}
    result = run(config, progress=False)
    success = result.success_by_cycle()
    assert len(success) == 3 and math.isnan(success[1]) and not math.isnan(success[2])
    assert result.cycles[1].evaluate is None and result.cycles[2].evaluate is not None
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "evaluate" not in summary["cycles"][1] and "evaluate" in summary["cycles"][2]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert rows[1]["heldout_success"] is None and rows[2]["heldout_success"] is not None
    assert Path(result.report).stat().st_size > 10_000


def test_the_stage_functions_run_a_cycle_by_hand(tmp_path, agent_server, tiny_build):
    """The library API beside coevolve.run: the stages called one by one (as the loop's
    nodes call them) write the cycle's files and return what they made."""
    import asyncio

    from coevolve import build_runtime
    from coevolve.config import CoevolveConfig
    from coevolve.graph.cycle import stages

    config = CoevolveConfig.model_validate(
        endpoint_config(tmp_path / "run", agent_server, tiny_build)
    )
    rt = build_runtime(config, progress=False)

    async def one_cycle():
        trajectories, rolled = await stages.rollout(rt, 1)
        flagged, flags = await stages.signals(rt, 1, trajectories)
        synthesized, made = await stages.synthesize(rt, 1, flagged)
        sample, pooled = stages.update_pool(rt, 1, synthesized.accepted)
        trained, _ = await stages.train(rt, 1, trajectories, flagged, sample, adapter=None)
        episodes, evaluation = await stages.evaluate(rt, 1)
        return (
            (trajectories, rolled, flagged, flags, synthesized, made),
            (sample, pooled, trained, episodes, evaluation),
        )

    (
        (trajectories, rolled, flagged, flags, synthesized, made),
        (sample, pooled, trained, episodes, evaluation),
    ) = asyncio.run(one_cycle())
    files = rt.files(1)
    assert rolled.episodes == len(trajectories) == 48 and files.rollouts() == trajectories
    assert flags.kept == len(flagged) > 0 and files.flagged() == flagged
    assert made.accepted == len(synthesized.accepted) > 0
    assert files.synthesized() == synthesized.accepted
    assert pooled.added == len(synthesized.accepted) and sample.accepted == synthesized.accepted
    assert trained.steps == 2 and files.train_record.exists()
    assert evaluation.episodes == len(episodes) == 18 and files.evaluation_episodes.exists()


def _models_in(annotation: Any, seen: set[type]) -> None:
    import typing

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation not in seen:
            seen.add(annotation)
            for field in annotation.model_fields.values():
                _models_in(field.annotation, seen)
        return
    for argument in typing.get_args(annotation):
        _models_in(argument, seen)


def test_the_checkpoint_serializer_names_every_record_the_graphs_state_holds():
    import typing

    from coevolve.graph.cycle.state import CycleState
    from coevolve.graph.synthesis.state import BranchState, SynthesisState
    from coevolve.runner import checkpoint_serializer

    seen: set[type] = set()
    for state in (CycleState, SynthesisState, BranchState):
        for annotation in typing.get_type_hints(state, include_extras=True).values():
            _models_in(annotation, seen)
    allowed = checkpoint_serializer()._allowed_msgpack_modules
    assert {"Task", "FlaggedTrajectory", "ExplorationRound", "JudgedCandidate"} <= {
        model.__name__ for model in seen
    }
    missing = sorted(
        f"{m.__module__}.{m.__name__}" for m in seen if (m.__module__, m.__name__) not in allowed
    )
    assert not missing, f"add their modules to runner.CHECKPOINTED_MODULES: {missing}"
