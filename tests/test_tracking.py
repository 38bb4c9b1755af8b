"""Experiment tracking: a two-cycle run with ``--set tracking.report_to=[tensorboard]`` writes
TensorBoard event files, read back with TensorBoard's own reader; and clean stops: an
endpoint that refuses the adapter load ends `coevolve run` with one line and the resume
command (a traceback only with --debug), and the resumed run completes.

Runs use the tiny bootstrap model and the reference agent behind the local
OpenAI-compatible test server, as tests/test_cycle.py does.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from coevolve.envs.world import load_split
from coevolve.outputs.tracking import TrackingConfig, TrainTracking, cycle_metrics, require_backends
from coevolve.testing.presets import endpoint_run
from coevolve.testing.reference_agent import reference_replies


def broken(task_id: str) -> bool:
    return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % 3 == 0


@pytest.fixture
def agent_server():
    from coevolve.testing.openai_server import ScriptedOpenAIServer

    tasks = load_split("train") + load_split("heldout")
    server = ScriptedOpenAIServer(reference_replies(tasks, wrong=broken)).start()
    yield server
    server.stop()


def config_file(tmp_path: Path, server, model_dir: Path, cycles: int) -> Path:
    config = endpoint_run(
        tmp_path / "run",
        server.base_url,
        server.model,
        model_dir,
        cycles=cycles,
        endpoints={"agent": {"max_retries": 0}},
        pool={"rollout_tasks": 6},
        signals={"budget": 4},
        training={"max_steps": 3},
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def coevolve(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "coevolve", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


# --------------------------------------------------------------------------- tracking


def test_report_to_and_the_step_axis_reach_the_trainer_arguments(tmp_path):
    assert TrainTracking(config=TrackingConfig(), run_dir="r").arguments() == {"report_to": "none"}
    tracking = TrainTracking(
        config=TrackingConfig(report_to=["tensorboard"], project="p"),
        run_dir=str(tmp_path / "my-run"),
        step_offset=5,
    )
    arguments = tracking.arguments()
    assert arguments["report_to"] == ["tensorboard"] and arguments["run_name"] == "my-run"
    assert arguments["project"] == "p"
    with pytest.raises(ValueError, match="'none' with trackers"):
        TrackingConfig(report_to=["none", "tensorboard"])
    with pytest.raises(ValueError, match="report_to"):
        TrackingConfig(report_to=["tensorbord"])


def test_cycle_metrics_cover_the_loop_figures():
    from coevolve.outputs.summary import CycleSummary

    evaluation = {
        "success": 0.25,
        "tool_sequence": 0.5,
        "calls": 0.6,
        "episodes": 4,
        "by_family": {"buy_item": 1.0},
        "time_s": 4.0,
    }
    summary = CycleSummary.model_validate(
        {
            "cycle": 1,
            "rollout": {
                "tasks": 6,
                "seed_tasks": 6,
                "synthesized_tasks": 0,
                "episodes": 12,
                "success": 0.5,
                "time_s": 3.0,
            },
            "signals": {
                "flagged": 4,
                "kept": 3,
                "by_kind": {"rare": 2, "boundary": 2},
                "time_s": 0.1,
            },
            "synthesize": {
                "candidates": 5,
                "accepted": 2,
                "duplicates": 1,
                "top_rejections": {"reply too long: 200000 characters (x)": 2},
                "time_s": 2.0,
            },
            "pool": {"size": 62, "added": 2, "seed": 60, "synthesized": 2, "time_s": 0.0},
            "train": {
                "algorithm": "sft",
                "adapter_dir": "a",
                "steps": 3,
                "final_loss": 1.5,
                "stage_time_s": 9.0,
            },
            "evaluate": evaluation,
        }
    )
    metrics = cycle_metrics(summary)
    assert metrics["cycle"] == 1 and all(isinstance(v, float) for v in metrics.values())
    assert metrics["heldout/success"] == 0.25 and metrics["heldout/success/buy_item"] == 1.0
    assert metrics["heldout/tool_sequence"] == 0.5
    assert metrics["rollout/success"] == 0.5 and metrics["rollout/episodes"] == 12
    assert metrics["rollout/left_out"] == 0 and metrics["heldout/left_out"] == 0
    assert metrics["signals/rare"] == 2 and metrics["signals/flagged"] == 4
    assert metrics["signals/kept"] == 3
    assert metrics["synthesis/candidates"] == 5 and metrics["synthesis/accepted"] == 2
    assert metrics["synthesis/judged_ok"] == 0 and metrics["synthesis/duplicates"] == 1
    assert metrics["synthesis/rejected/reply_too_long_200000_characters"] == 2
    assert metrics["pool/size"] == 62 and metrics["pool/added"] == 2
    assert metrics["train/cycle_steps"] == 3 and metrics["train/cycle_final_loss"] == 1.5
    assert metrics["time/train_s"] == 9.0  # the whole stage
    assert metrics["time/rollout_s"] == 3.0 and metrics["time/evaluate_s"] == 4.0
    # The baseline has the held-out figures and the evaluation's time only.
    baseline = cycle_metrics(
        CycleSummary.model_validate({"cycle": 0, "evaluate": evaluation, "time_s": 5.0})
    )
    assert set(baseline) == {
        "cycle",
        "heldout/success",
        "heldout/tool_sequence",
        "heldout/left_out",
        "heldout/success/buy_item",
        "time/evaluate_s",
    }


@pytest.mark.parametrize("backend", ["trackio", "wandb", "mlflow"])
def test_optional_backends_say_how_to_install(backend):
    if importlib.util.find_spec(backend) is not None:
        pytest.skip(f"{backend} is installed; this checks the message when it is not")
    with pytest.raises(RuntimeError, match=rf"pip install 'coevolve\[{backend}\]'"):
        require_backends(TrackingConfig(report_to=[backend]))


@pytest.mark.slow
def test_a_launched_step_logs_into_the_loops_wandb_and_mlflow_runs(
    tmp_path, agent_server, tiny_build
):
    """launcher: subprocess: the training child reports into the loop's own W&B run
    (offline) and MLflow run (a local file store), not into new runs of its own."""
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    config = config_file(tmp_path, agent_server, tiny_build, cycles=1)
    store = tmp_path / "mlruns"
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "MLFLOW_TRACKING_URI": store.as_uri(),
        "MLFLOW_ALLOW_FILE_STORE": "true",  # MLflow 3 wants a database; a file store is asked for
        "PYTHONUNBUFFERED": "1",
    }
    out = subprocess.run(
        [
            *(sys.executable, "-m", "coevolve", "run", str(config)),
            *("--set", "tracking.report_to=[wandb,mlflow]"),
            *("--set", "training.launcher=subprocess"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "run"
    assert "training step launched (subprocess)" in (run_dir / "run.log").read_text()

    # MLflow: one run holds the trainer's loss (the child) and the held-out figures (the loop).
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    mlflow.set_tracking_uri(store.as_uri())
    [experiment] = [e for e in mlflow.search_experiments() if e.name == "coevolve"]
    runs = mlflow.search_runs([experiment.experiment_id], output_format="list")
    assert len(runs) == 1, [r.info.run_name for r in runs]
    assert {"loss", "heldout/success/all", "heldout/success/buy_item"} <= set(runs[0].data.metrics)

    # W&B offline: the loop's and the child's records carry the one run id.
    records = sorted((tmp_path / "wandb").glob("offline-run-*"))
    ids = {record.name.rsplit("-", 1)[-1] for record in records}
    assert len(records) >= 2 and len(ids) == 1, [record.name for record in records]


@pytest.mark.slow
def test_two_cycles_write_tensorboard_scalars_on_one_step_axis(tmp_path, agent_server, tiny_build):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = config_file(tmp_path, agent_server, tiny_build, cycles=2)
    out = coevolve("run", str(config), "--set", "tracking.report_to=[tensorboard]")
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "run"
    # The resolved config records the override.
    saved = (run_dir / "config.yaml").read_text()
    assert saved.startswith("# --set tracking.report_to=[tensorboard]\n")
    assert yaml.safe_load(saved)["tracking"]["report_to"] == ["tensorboard"]

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "heldout/success", "pool/size", "signals/flagged"} <= tags, tags
    assert any(tag.startswith("heldout/success/") for tag in tags)
    loss_steps = [event.step for event in events.Scalars("train/loss")]
    # max_steps 3 per cycle, logged every step: cycle 2 continues where cycle 1 ended.
    assert loss_steps == [1, 2, 3, 4, 5, 6]
    heldout = [event.step for event in events.Scalars("heldout/success")]
    assert heldout == [0, 3, 6]  # baseline, then the end of each cycle's training
    cycles = [event.value for event in events.Scalars("cycle")]
    assert cycles == [0, 1, 2]


# --------------------------------------------------------------------------- clean stops


@pytest.mark.slow
def test_a_refused_adapter_load_stops_in_one_line_and_resume_completes(
    tmp_path, agent_server, tiny_build
):
    config = config_file(tmp_path, agent_server, tiny_build, cycles=1)
    run_dir = tmp_path / "run"
    agent_server.refuse_adapters = (404, "Not Found")  # vLLM without runtime LoRA updating

    debug = coevolve("run", str(config), "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    assert "load_lora_adapter refused (HTTP 404" in debug.stderr

    # Resumed (the adapter is trained already, so this fails fast): one line, no traceback.
    stopped = coevolve("run", "--resume", str(run_dir))
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr, stopped.stderr
    [line] = [line for line in stopped.stderr.splitlines() if line.startswith("error:")]
    assert f"endpoint {agent_server.base_url}" in line
    assert "load_lora_adapter refused (HTTP 404" in line
    assert line.endswith(f"continue it with: coevolve run --resume {run_dir}")

    agent_server.refuse_adapters = None
    resumed = coevolve("run", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (run_dir / "metrics.jsonl").exists()
    assert agent_server.loaded_adapters  # the adapter is served now
