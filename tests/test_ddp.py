"""The training step as a launched process: config checks, the step spec, launch errors,
and a real 2-process DDP run on the CPU (gloo) through ``accelerate launch``.

``pytest -k ddp`` selects these. The DDP test compares a 2-process adapter with a
1-process one (``launcher: subprocess``) trained on the same data: same tensors,
and the 2-process result says both ranks took part (``world_size``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from coevolve.agents.policy.conversation import reference_conversation
from coevolve.config import CoevolveConfig
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.outputs.tracking import TrackingConfig, TrainTracking
from coevolve.records import ModelTurn, Task
from coevolve.testing.presets import tiny_training
from coevolve.training.config import TrainingConfig
from coevolve.training.datasets import PreferencePair, TrainingConversation
from coevolve.training.launch import (
    ACCELERATE_CONFIGS,
    LaunchError,
    TrainingStepSpec,
    launch_command,
    launch_train_adapter,
    resolve_accelerate_config,
    run_child,
)
from coevolve.training.trainers import ADAPTER_MARKER, is_adapter_complete


@pytest.fixture(scope="module")
def conversations():
    return [reference_conversation(WorldEnvironment(), task)[0] for task in load_split("train")[:8]]


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"launcher": "accelerate"}, "needs accelerate_config"),
        ({"accelerate_config": "ddp"}, "set launcher: accelerate"),
        ({"launcher": "subprocess", "num_processes": 2}, "remove num_processes"),
        (
            {"launcher": "accelerate", "accelerate_config": "ddp", "num_processes": 3}
            | {"algorithm": "grpo", "batch_size": 4}
            | {"grpo": {"num_generations": 2, "prompts_per_step": 4}},
            "global batch",
        ),
    ],
)
def test_ddp_launcher_config_rejects_bad_combinations(values, message):
    with pytest.raises(ValidationError, match=message):
        TrainingConfig(**values)


def test_ddp_launcher_config_accepts_the_launchers_and_hard_negatives_stay_in_process():
    assert TrainingConfig().launcher == "inprocess"
    TrainingConfig(launcher="subprocess")
    TrainingConfig(launcher="accelerate", accelerate_config="ddp-cpu", num_processes=2)
    with pytest.raises(ValidationError, match=r"training\.launcher: inprocess"):
        CoevolveConfig.model_validate(
            {"hard_negatives": {"enabled": True}, "training": {"launcher": "subprocess"}}
        )


# --------------------------------------------------------------------------- spec


def test_ddp_step_spec_round_trips_through_json(conversations, tmp_path):
    task = load_split("train")[0]
    pair = PreferencePair(
        task_id=task.id,
        prompt=conversations[0][:2],
        chosen=conversations[0][2:],
        rejected=[{"role": "assistant", "content": "no"}],
    )
    tool_call = next(m for m in conversations[0] if m.get("tool_calls"))
    with_ids = TrainingConversation(
        messages=conversations[1],
        tools=[{"type": "function", "function": {"name": "send_message"}}],
        model_turns=[ModelTurn(message_index=2, prompt_new_ids=[1, 2, 3], completion_ids=[4, 5])],
    )
    spec = TrainingStepSpec(
        config=TrainingConfig(algorithm="grpo", launcher="subprocess", max_steps=3),
        model_dir="/models/base",
        output_dir=str(tmp_path / "adapter"),
        previous_adapter=str(tmp_path / "previous"),
        conversations=[*conversations, with_ids],
        example_weights=[1.0] * (len(conversations) + 1),
        pairs=[pair],
        tasks=[task],
        environment="world",
        system_prompt="be brief",
        tools_in_prompt=True,
        tracking=TrainTracking(config=TrackingConfig(), run_dir=str(tmp_path), step_offset=7),
        capability_state_path=str(tmp_path / "capability_state.json"),
        seed=1234,
        result_file=str(tmp_path / "step.result.json"),
    )
    path = tmp_path / "step.json"
    path.write_text(spec.model_dump_json())
    again = TrainingStepSpec.model_validate_json(path.read_text())
    assert again == spec
    assert isinstance(again.tasks[0], Task) and again.tasks[0] == task
    assert again.conversations[0] == conversations[0]  # tool-call arguments intact
    assert tool_call in again.conversations[0]
    assert again.conversations[-1] == with_ids  # tools and token ids, not plain messages
    assert again.make_env() is WorldEnvironment
    assert TrainingStepSpec(**{**spec.model_dump(), "environment": None}).make_env() is None


def test_ddp_launch_refuses_a_grpo_environment_it_cannot_rebuild(tmp_path):
    with pytest.raises(ValueError, match="use launcher: inprocess"):
        launch_train_adapter(
            TrainingConfig(algorithm="grpo", launcher="subprocess"),
            step_file=tmp_path / "step.json",
            log_file=tmp_path / "run.log",
            environment="world",
            make_env=lambda: WorldEnvironment(),
            model_dir=tmp_path,
            output_dir=tmp_path / "adapter",
            tasks=load_split("train")[:1],
        )
    assert not (tmp_path / "step.json").exists()


# --------------------------------------------------------------------------- launching


def test_ddp_accelerate_commands_and_config_errors(tmp_path):
    shipped = {path.stem for path in ACCELERATE_CONFIGS.glob("*.yaml")}
    assert shipped == {"ddp-cpu", "ddp", "deepspeed-zero2", "fsdp"}
    for name in shipped:
        assert resolve_accelerate_config(name) == ACCELERATE_CONFIGS / f"{name}.yaml"
    config = TrainingConfig(launcher="accelerate", accelerate_config="ddp-cpu", num_processes=2)
    command = launch_command(config, tmp_path / "step.json")
    assert command[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    step = str(tmp_path / "step.json")
    assert command[-5:] == ["--num_processes", "2", "-m", "coevolve.training", step]
    assert str(ACCELERATE_CONFIGS / "ddp-cpu.yaml") in command
    subprocess_command = launch_command(
        TrainingConfig(launcher="subprocess"), tmp_path / "step.json"
    )
    assert subprocess_command == [
        sys.executable,
        "-m",
        "coevolve.training",
        str(tmp_path / "step.json"),
    ]

    with pytest.raises(LaunchError, match=r"not found.*ddp-cpu"):
        resolve_accelerate_config(str(tmp_path / "missing.yaml"))
    multi_cpu = tmp_path / "multi-cpu.yaml"
    multi_cpu.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\n")
    with pytest.raises(LaunchError, match="MULTI_CPU starts one process"):
        resolve_accelerate_config(str(multi_cpu))
    multi_cpu.write_text("distributed_type: MULTI_CPU\nnum_processes: 1\n")
    assert resolve_accelerate_config(str(multi_cpu)) == multi_cpu
    with pytest.raises(LaunchError, match="MULTI_CPU starts one process"):
        resolve_accelerate_config(str(multi_cpu), num_processes=2)


def test_ddp_child_failures_name_the_log_and_quote_its_last_lines(tmp_path):
    log = tmp_path / "run.log"
    crash = "print('loading'); raise SystemExit('model weights are missing')"
    with pytest.raises(LaunchError) as failed:
        run_child([sys.executable, "-c", crash], log, "training (subprocess)", None)
    text = str(failed.value)
    assert "exited with status 1" in text and str(log) in text
    assert "model weights are missing" in text and "loading" in text
    assert "model weights are missing" in log.read_text()

    kill = "import os, signal; print('about to die', flush=True); os.kill(os.getpid(), 9)"
    with pytest.raises(LaunchError, match="killed by SIGKILL") as killed:
        run_child([sys.executable, "-c", kill], log, "training (subprocess)", None)
    assert "about to die" in str(killed.value)
    assert log.read_text().count("loading") == 1  # appended, not overwritten


def test_ddp_a_crashing_training_step_raises_with_its_log(conversations, tmp_path):
    """A real step whose base model does not exist: the child's own error reaches the parent."""
    config = tiny_training().model_copy(update={"launcher": "subprocess"})
    with pytest.raises(LaunchError) as failed:
        launch_train_adapter(
            config,
            step_file=tmp_path / "step.json",
            log_file=tmp_path / "run.log",
            progress=False,
            model_dir=tmp_path / "no-model",
            output_dir=tmp_path / "adapter",
            conversations=conversations[:2],
        )
    assert "run.log" in str(failed.value) and "no-model" in str(failed.value)
    assert not (tmp_path / "adapter").exists()


# --------------------------------------------------------------------------- real DDP


def _shapes(adapter: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as tensors:
        return {key: tuple(tensors.get_slice(key).get_shape()) for key in tensors.keys()}


def test_ddp_two_cpu_processes_train_the_adapter_one_process_trains(
    tiny_build, conversations, tmp_path, monkeypatch
):
    import torch
    from safetensors.torch import load_file

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # 2 ranks on 2 shared cores
    base = tiny_training().model_copy(update={"max_steps": 3, "batch_size": 2})
    runs = {
        "one": base.model_copy(update={"launcher": "subprocess"}),
        "two": TrainingConfig.model_validate(
            base.model_dump()
            | {"launcher": "accelerate", "accelerate_config": "ddp-cpu", "num_processes": 2}
        ),
    }
    results = {}
    for name, config in runs.items():
        results[name] = launch_train_adapter(
            config,
            step_file=tmp_path / name / "step.json",
            log_file=tmp_path / name / "run.log",
            progress=False,
            seed=7,
            model_dir=tiny_build,
            output_dir=tmp_path / name / "adapter",
            conversations=conversations,
        )
    one, two = results["one"], results["two"]
    assert (one.world_size, two.world_size) == (1, 2)  # both ranks joined the gloo group
    assert one.steps == two.steps == 3 and two.skipped is None
    assert one.examples == two.examples == len(conversations)
    for name, result in results.items():
        adapter = tmp_path / name / "adapter"
        assert result.adapter_dir == str(adapter) and is_adapter_complete(adapter)
        stored = json.loads((adapter / ADAPTER_MARKER).read_text())["result"]
        assert stored == result.model_dump()  # the parent read what the child saved
    assert _shapes(tmp_path / "one" / "adapter") == _shapes(tmp_path / "two" / "adapter")
    trained = load_file(str(tmp_path / "two" / "adapter" / "adapter_model.safetensors"))
    assert any(
        key.endswith("lora_B.weight") and tensor.abs().sum() > 0 for key, tensor in trained.items()
    )
    assert all(torch.isfinite(tensor).all() for tensor in trained.values())
    log = (tmp_path / "two" / "run.log").read_text()
    assert log.count("coevolve.trainer INFO: [rank 0] step") >= 3  # only rank 0 logs steps
    assert "[rank 1] step" not in log
    # Only rank 0 wrote: no leftover hidden sibling of a second, racing save.
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == [
        "adapter",
        "run.log",
        "step.json",
        "step.result.json",
    ]


def test_ddp_a_cycle_of_the_loop_trains_through_accelerate_launch(
    tmp_path, cache_dir, tiny_build, monkeypatch
):
    """The loop's train node with launcher accelerate: data built in the loop, 2 ranks train."""
    from coevolve.runner import run
    from coevolve.testing.presets import tiny_bootstrap, tiny_cycle
    from coevolve.training.adapters import TrainResult

    monkeypatch.setenv("COEVOLVE_CACHE", str(cache_dir))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    training = {"launcher": "accelerate", "accelerate_config": "ddp-cpu", "num_processes": 2}
    config = CoevolveConfig.model_validate(tiny_cycle(tmp_path / "run", training=training))
    result = run(config.model_copy(update={"bootstrap": tiny_bootstrap()}), progress=False)

    cycle = Path(result.run_dir) / "cycles" / "001"
    record = TrainResult.model_validate_json((cycle / "train.json").read_text())
    assert record.world_size == 2 and record.steps == 2 and record.skipped is None
    assert is_adapter_complete(Path(result.run_dir) / "adapters" / "cycle-1")
    spec = TrainingStepSpec.model_validate_json((cycle / "train-step.json").read_text())
    assert spec.conversations and spec.seed is not None  # the loop built the data
    log = (Path(result.run_dir) / "run.log").read_text()
    assert "training step launched (accelerate)" in log
    assert "coevolve.trainer INFO: [rank 0] step 2: {'loss'" in log
