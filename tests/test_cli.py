"""The coevolve command, run as a user runs it (a subprocess)."""

import json
import subprocess
import sys

import pytest


def coevolve(*args, check=True):
    result = subprocess.run(
        [sys.executable, "-m", "coevolve", *args], capture_output=True, text=True, timeout=300
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_help_does_not_import_heavy_libraries():
    assert "env" in coevolve("--help").stdout
    code = "import sys, coevolve.cli; print(sorted(m for m in ('torch', 'transformers', 'trl', 'chromadb') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_the_worlds_env_commands_do_not_import_torch():
    """The world's tool schemas come from our own reader of type hints and docstrings (the
    one a user's tools go through), not transformers' get_json_schema, which imports torch:
    `coevolve env show world` took 7 s on a loaded 2-core machine with it, 2 s without."""
    heavy = ("torch", "transformers", "trl", "chromadb")
    for args in (["show", "world", "--index", "3"], ["check", "world", "--split", "validation"]):
        code = (
            "import sys\nfrom coevolve.cli import main\n"
            f"sys.argv = ['coevolve', 'env', *{args!r}]\n"
            "try:\n    main()\nexcept SystemExit as stop:\n    assert not stop.code, stop.code\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
        assert out.strip().splitlines()[-1] == "[]", args


def test_env_check_world_json():
    result = coevolve("env", "check", "world", "--split", "validation", "--json")
    report = json.loads(result.stdout)
    assert report == {
        "env": "world",
        "split": "validation",
        "verified": report["total"],
        "total": report["total"],
    }
    assert report["total"] > 0


def test_env_check_world_all_splits_text():
    out = coevolve("env", "check", "world").stdout
    for split in ("train", "validation", "heldout"):
        assert f"split={split}: verified" in out


def test_env_check_bad_scope():
    result = coevolve("env", "check", "world", "--split", "test", check=False)
    assert result.returncode == 2 and "allowed: train, validation, heldout" in result.stderr
    result = coevolve("env", "check", "world", "--category", "multi_turn_base", check=False)
    assert result.returncode == 2 and "--category is for bfcl" in result.stderr
    result = coevolve("env", "check", "moon", check=False)
    assert result.returncode == 2 and "unknown environment" in result.stderr


def test_env_list_and_show():
    rows = json.loads(coevolve("env", "list", "--json").stdout)
    assert [row["env"] for row in rows] == ["world", "bfcl"]
    assert rows[0]["tools"] >= 25 and rows[0]["families"] >= 12
    out = coevolve("env", "show", "world", "--split", "heldout", "--index", "3").stdout
    assert "verifier score: 1.00" in out and "call:" in out


def test_config_show(tmp_path):
    assert "env:" in coevolve("config", "show").stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("env:\n  nmae: world\n")
    result = coevolve("config", "show", str(bad), check=False)
    assert result.returncode == 2 and "did you mean 'name'" in result.stderr


@pytest.mark.bfcl
def test_env_check_bfcl_json():
    pytest.importorskip("bfcl_eval")
    result = coevolve("env", "check", "bfcl", "--category", "multi_turn_miss_param", "--json")
    assert json.loads(result.stdout) == {
        "env": "bfcl",
        "category": "multi_turn_miss_param",
        "verified": 200,
        "total": 200,
    }


def test_eval_oracle_world_json():
    report = json.loads(
        coevolve(
            "eval", "--env", "world", "--split", "validation", "--policy", "oracle", "--json"
        ).stdout
    )
    assert report["policy"] == "oracle" and report["split"] == "validation"
    assert report["overall"]["success_rate"] == 1.0 and len(report["by_family"]) == 18


def test_eval_oracle_table_and_save(tmp_path):
    out = coevolve(
        "eval",
        "--env",
        "world",
        "--policy",
        "oracle",
        "--limit",
        "20",
        "--save",
        str(tmp_path / "t.jsonl"),
    ).stdout
    assert "overall" in out and "100.0%" in out
    assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 20


@pytest.mark.bfcl
def test_eval_oracle_bfcl_json():
    pytest.importorskip("bfcl_eval")
    report = json.loads(
        coevolve("eval", "--env", "bfcl", "--policy", "oracle", "--limit", "10", "--json").stdout
    )
    assert set(report["by_family"]) == {
        "multi_turn_base",
        "multi_turn_miss_func",
        "multi_turn_miss_param",
        "multi_turn_long_context",
    }
    assert report["overall"]["success_rate"] == 1.0


def test_eval_bad_policy():
    result = coevolve("eval", "--policy", "/nonexistent", check=False)
    assert result.returncode == 2 and "not 'oracle', 'bootstrap'" in result.stderr


def test_export_refuses_what_is_not_a_run(tmp_path):
    missing = coevolve("export", str(tmp_path), str(tmp_path / "out"), check=False)
    assert missing.returncode == 2 and "is not a run directory" in missing.stderr
    (tmp_path / "config.yaml").write_text("cycles: 1\n")
    empty = coevolve("export", str(tmp_path), str(tmp_path / "out"), check=False)
    assert empty.returncode == 2 and "no synthesized tasks or training examples" in empty.stderr
    bad = coevolve("export", str(tmp_path), str(tmp_path / "out"), "--format", "csv", check=False)
    assert bad.returncode == 2 and "allowed: jsonl, hf" in bad.stderr


def test_exported_sft_rows_load_as_one_configuration_and_train_one_trl_step(tmp_path, tiny_build):
    """The sft table keeps each example's tools (a JSON string, as TRL reads them) and weight,
    loads by its configuration name, and TRL's SFTTrainer takes one step on it as it is."""
    import json

    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from coevolve.common.tokenization import load_tokenizer
    from coevolve.envs.world import WorldEnvironment, load_split
    from coevolve.training.datasets import demonstrations_by_task

    run_dir = tmp_path / "run"
    (run_dir / "cycles" / "001").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("run_dir: run\n")
    tasks = load_split("train", size=4)
    tools = WorldEnvironment().tools()[:2]
    rows = [
        {"messages": messages, "tools": tools if index % 2 else None, "weight": 1.0 + index}
        for index, (_, messages) in enumerate(demonstrations_by_task(tasks, WorldEnvironment, ""))
    ]
    (run_dir / "cycles" / "001" / "train_data.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in rows)
    )
    for format in ("jsonl", "hf"):
        out = tmp_path / f"export-{format}"
        assert coevolve("export", str(run_dir), str(out), "--format", format, "--json")
        sft = load_dataset(str(out), "sft", split="train")
        assert sft.num_rows == len(rows) and sft["weight"] == [1.0, 2.0, 3.0, 4.0]
        assert json.loads(sft[1]["tools"]) == tools and sft[0]["tools"] is None
        assert sft[0]["messages"][-1]["role"] == "assistant"

    tokenizer = load_tokenizer(tiny_build)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(tiny_build)),
        processing_class=tokenizer,
        train_dataset=sft.remove_columns(["weight", "cycle"]),
        peft_config=LoraConfig(r=4, target_modules="all-linear"),
        args=SFTConfig(
            output_dir=str(tmp_path / "trl"),
            max_steps=1,
            per_device_train_batch_size=2,
            use_cpu=True,
            bf16=False,
            report_to=[],
            save_strategy="no",
            max_length=512,
        ),
    )
    assert trainer.train().global_step == 1
