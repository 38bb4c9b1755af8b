"""`coevolve export` writes tables TRL's trainers take as they are (issue 58): SFT, DPO and
GRPO prompts, tools as a JSON string, no internal columns. One TRL step on each, on the
tiny model, from the exported files loaded with ``datasets.load_dataset``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.records import ModelTurn
from coevolve.run_files import CycleFiles
from coevolve.training.datasets import PreferencePair, demonstrations_by_task, json_arguments
from coevolve.training.grpo.grpo_trainer import grpo_rows


def fake_run(run: Path) -> None:
    """A run directory whose three cycles trained SFT, DPO and GRPO on world tasks."""
    run.mkdir()
    (run / "config.yaml").write_text("cycles: 3\n")
    tasks = [t for t in load_split("train") if len(t.turns) == 1][:4]
    demonstrated = demonstrations_by_task(tasks, WorldEnvironment)
    # One short schema: the tiny model's context (1,024 tokens of a 1,024-token vocabulary)
    # holds no world tool list.
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search_products",
                "description": "Search the shop.",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}},
                    "required": ["query"],
                },
            },
        }
    ]
    sft = [{"messages": json_arguments(m), "tools": tools, "weight": 1.0} for _, m in demonstrated]
    CycleFiles(run, 1).write_train_data(sft)
    pairs = []
    for task, messages in demonstrated:
        cut = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        chosen = json_arguments(messages[cut:])
        rejected = [{"role": "assistant", "content": "I cannot help with that."}]
        turn = ModelTurn(message_index=cut, prompt_new_ids=[1, 2], completion_ids=[3])
        pairs.append(
            PreferencePair(
                task_id=task.id,
                prompt=json_arguments(messages[:cut]),
                chosen=chosen,
                rejected=rejected,
                tools=tools,
                chosen_turns=[turn],
                rejected_turns=[turn],
            )
        )
    CycleFiles(run, 2).write_train_data(pairs)
    prompts = []
    for task in tasks:
        rows, schemas = grpo_rows([task], WorldEnvironment, None, 1, True)
        prompts += [{"prompt": r["prompt"], "tools": schemas, "task_id": task.id} for r in rows]
    CycleFiles(run, 3).write_train_data(prompts)


def test_the_exported_tables_have_trl_columns_only(tmp_path):
    from datasets import load_dataset

    from coevolve.outputs.export import export_run

    fake_run(tmp_path / "run")
    out, cache = tmp_path / "out", tmp_path / "datasets-cache"  # no other test's tables
    counts = export_run(tmp_path / "run", out, "hf")
    assert counts == {"sft": 4, "dpo": 4, "grpo": 4}
    columns = {
        name: load_dataset(str(out), name, split="train", cache_dir=str(cache)).column_names
        for name in counts
    }
    assert columns == {
        "sft": ["messages", "tools", "weight", "cycle"],
        "dpo": ["prompt", "chosen", "rejected", "tools", "task_id", "cycle"],
        "grpo": ["prompt", "tools", "task_id", "cycle"],
    }
    dpo = load_dataset(str(out), "dpo", split="train", cache_dir=str(cache))
    assert isinstance(dpo[0]["tools"], str) and json.loads(dpo[0]["tools"])[0]["type"] == "function"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl", "hf"])
def test_trl_trains_one_step_on_each_exported_table(tmp_path, tiny_build, fmt):
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    from coevolve.common.tokenization import load_tokenizer
    from coevolve.outputs.export import export_run

    fake_run(tmp_path / "run")
    export_run(tmp_path / "run", tmp_path / "out", fmt)  # type: ignore[arg-type]
    tokenizer = load_tokenizer(tiny_build)
    tokenizer.padding_side = "right"  # training pads on the right
    common = {
        "max_steps": 1,
        "per_device_train_batch_size": 2,
        "report_to": [],
        "save_strategy": "no",
        "use_cpu": True,
        "disable_tqdm": True,
    }

    def table(name: str):
        return load_dataset(
            str(tmp_path / "out"), name, split="train", cache_dir=str(tmp_path / "datasets-cache")
        )

    def model():
        return AutoModelForCausalLM.from_pretrained(str(tiny_build))

    sft = SFTTrainer(
        model=model(),
        args=SFTConfig(output_dir=str(tmp_path / "sft"), max_length=1024, **common),
        train_dataset=table("sft"),
        processing_class=tokenizer,
    )
    assert sft.train().global_step == 1
    dpo = DPOTrainer(
        model=model(),
        args=DPOConfig(output_dir=str(tmp_path / "dpo"), max_length=1024, **common),
        train_dataset=table("dpo"),
        processing_class=tokenizer,
    )
    assert dpo.train().global_step == 1

    def reward(completions, tools, **_):
        assert all(isinstance(t, str) for t in tools)  # the column reaches a reward function
        return [float(len(str(c))) for c in completions]

    left = load_tokenizer(tiny_build)
    grpo = GRPOTrainer(
        model=model(),
        reward_funcs=reward,
        args=GRPOConfig(
            output_dir=str(tmp_path / "grpo"),
            num_generations=2,
            max_completion_length=8,
            **common,
        ),
        train_dataset=table("grpo"),
        processing_class=left,
    )
    assert grpo.train().global_step == 1


def test_push_to_hub_pushes_one_configuration_per_table(tmp_path, monkeypatch):
    from datasets import Dataset
    from huggingface_hub import constants

    from coevolve.outputs import export

    fake_run(tmp_path / "run")
    pushed = []

    def push_to_hub(self, repo, config_name, split, private):
        pushed.append((repo, config_name, split, self.column_names))

    monkeypatch.setattr(Dataset, "push_to_hub", push_to_hub)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert export.push_tables(tmp_path / "run", "acme/coevolve-run") == {
        "sft": 4,
        "dpo": 4,
        "grpo": 4,
    }
    assert [(repo, name, split) for repo, name, split, _ in pushed] == [
        ("acme/coevolve-run", name, "train") for name in ("sft", "dpo", "grpo")
    ]


def test_push_to_hub_offline_fails_in_one_clear_line(tmp_path):
    import os
    import subprocess
    import sys

    fake_run(tmp_path / "run")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "coevolve",
            "export",
            str(tmp_path / "run"),
            str(tmp_path / "out"),
            "--push-to-hub",
            "acme/coevolve-run",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(
        "error: cannot push to acme/coevolve-run: the Hugging Face Hub is offline"
    )
    assert (tmp_path / "out" / "sft.jsonl").is_file()  # the export itself was written


@pytest.mark.slow
def test_a_grpo_cycle_exports_its_prompts(tmp_path, cache_dir, tiny_build, monkeypatch):
    """A real GRPO cycle on the tiny model writes the prompts it trained from, and the
    export turns them into the grpo table."""
    from coevolve.config import CoevolveConfig
    from coevolve.outputs.export import export_tables
    from coevolve.runner import run
    from coevolve.testing.presets import load_preset, tiny_bootstrap

    monkeypatch.setenv("COEVOLVE_CACHE", str(cache_dir))
    training = {**load_preset("training-tiny"), "algorithm": "grpo", "max_steps": 1}
    config = CoevolveConfig.model_validate(
        {
            "run_dir": str(tmp_path / "run"),
            "cycles": 1,
            "rollout": {"k": 2, "max_tool_calls": 2},
            "policy": {"max_new_tokens": 16},
            "pool": {"rollout_tasks": 4, "replay_demonstrations": 2},
            "training": training,
            "evaluation": {"per_family": 1},
        }
    ).model_copy(update={"bootstrap": tiny_bootstrap()})
    run(config, progress=False)
    grpo = export_tables(tmp_path / "run")["grpo"]
    assert grpo and {row["cycle"] for row in grpo} == {1}
    assert grpo[0]["prompt"][-1]["role"] == "user" and json.loads(grpo[0]["tools"])
    # The cycle's adapter: a model card with the run's figures, loadable by PEFT.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "run" / "adapters" / "cycle-1"
    card = (adapter / "README.md").read_text()
    assert "# coevolve adapter, cycle 1" in card and "| training algorithm | grpo |" in card
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_build)), str(adapter))
