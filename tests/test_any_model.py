"""Any Hugging Face model as the base (issue 58): the in-process bootstrap base and
``policy.train_model`` take a Hub model id or a local model directory, as TRL's
``from_pretrained`` does, with ``smollm2`` and ``tiny`` kept as names. Offline: the local
directory is one saved from the tiny model, and the Hub id is that directory laid out as a
snapshot in a Hub cache of the test's own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coevolve.common.hf_models import ModelNotFound, resolve_model
from coevolve.training.bootstrap.bootstrap_config import BootstrapConfig

ROOT = Path(__file__).resolve().parents[1]


def saved_tiny_model(tiny_build: Path, target: Path) -> Path:
    """The tiny model as a user's own directory: from_pretrained, then save_pretrained."""
    from transformers import AutoModelForCausalLM

    from coevolve.common.tokenization import load_tokenizer

    AutoModelForCausalLM.from_pretrained(str(tiny_build)).save_pretrained(str(target))
    load_tokenizer(tiny_build).save_pretrained(str(target))
    return target


def hub_cache_with(model_dir: Path, cache: Path, repo: str) -> None:
    """``model_dir`` as the cached snapshot of Hub model ``repo`` (the Hub cache's layout)."""
    commit = "0" * 40
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    shutil.copytree(model_dir, root / "snapshots" / commit)


def test_the_named_bases_stay_and_any_other_name_is_a_model():
    assert BootstrapConfig().base == "smollm2"
    assert BootstrapConfig(base="tiny").base == "tiny"
    assert BootstrapConfig(base="HuggingFaceTB/SmolLM2-360M-Instruct", max_steps=4).max_steps == 4
    with pytest.raises(ValueError, match="time_budget_s applies to base 'tiny' only"):
        BootstrapConfig(base="/models/mine", time_budget_s=10)


def test_what_is_no_model_says_so_in_one_line(tmp_path):
    with pytest.raises(ModelNotFound, match="no model directory there"):
        resolve_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFound, match=r"without config\.json"):
        resolve_model(tmp_path / "empty")


@pytest.mark.slow
def test_a_local_directory_and_a_hub_id_as_the_base_and_as_train_model(tmp_path, tiny_build):
    from coevolve.training.bootstrap.build import bootstrap, load_metadata

    mine = saved_tiny_model(tiny_build, tmp_path / "my-model")
    assert resolve_model(mine) == mine
    config = BootstrapConfig(
        base=str(mine), max_steps=2, batch_size=2, max_length=256, eval_split=None
    )
    built = bootstrap(config, cache_dir=tmp_path / "cache", progress=False)
    metadata = load_metadata(built)
    assert metadata["base"] == str(mine) and metadata["steps"] == 2
    assert metadata["base_model"]["source"] == str(mine)
    # The base was prepared once, with the plain-call chat template the in-process policy speaks.
    [prepared] = (tmp_path / "cache" / "base").glob("hf-*")
    from coevolve.common.tokenization import load_tokenizer
    from coevolve.training.chat_template import PLAIN_CALLS_TEMPLATE

    assert load_tokenizer(prepared).chat_template == PLAIN_CALLS_TEMPLATE
    assert bootstrap(config, cache_dir=tmp_path / "cache", progress=False) == built  # cached
    # One sequence per forward pass (the quickstart's memory setting): its own build, the
    # same step (no LoRA dropout in the bootstrap, so only float rounding differs).
    micro = config.model_copy(update={"micro_batch_size": 1})
    micro_built = bootstrap(micro, cache_dir=tmp_path / "cache", progress=False)
    assert micro_built != built
    assert load_metadata(micro_built)["config"]["micro_batch_size"] == 1
    assert load_metadata(micro_built)["final_loss"] == pytest.approx(
        metadata["final_loss"], rel=1e-3
    )

    # A Hub id, offline, from a Hub cache: the bootstrap base and an endpoint's train_model.
    hub = tmp_path / "hub"
    hub_cache_with(mine, hub, "acme/tiny-agent")
    script = textwrap.dedent(
        """
        import json
        from coevolve.common.hf_models import ModelNotFound, resolve_model
        from coevolve.config import CoevolveConfig
        from coevolve.loop.build_runtime import local_model_dir

        found = resolve_model("acme/tiny-agent")
        config = CoevolveConfig.model_validate({
            "endpoints": {"e": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}},
            "policy": {"kind": "endpoint", "endpoint": "e", "train_model": "acme/tiny-agent"},
        })
        try:
            resolve_model("acme/not-cached")
            missing = None
        except ModelNotFound as err:
            missing = str(err)
        print(json.dumps({"found": str(found), "train": str(local_model_dir(config)),
                           "missing": missing}))
        """
    )
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    snapshot = str(hub / "models--acme--tiny-agent" / "snapshots" / ("0" * 40))
    assert out["found"] == out["train"] == snapshot
    assert "acme/not-cached" in out["missing"] and "\n" not in out["missing"]

    hub_config = config.model_copy(update={"base": "acme/tiny-agent"})
    code = (
        "import json, sys; from coevolve.training.bootstrap.build import bootstrap, load_metadata; "
        "from coevolve.training.bootstrap.bootstrap_config import BootstrapConfig; "
        f"c = BootstrapConfig.model_validate_json({hub_config.model_dump_json()!r}); "
        "p = bootstrap(c, cache_dir=sys.argv[1], progress=False); "
        "print(json.dumps(load_metadata(p)['base_model']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["source"] == snapshot


def test_a_build_that_fails_in_its_own_process_says_so_and_leaves_no_agent(
    tmp_path, tiny_build, capfd
):
    from coevolve.training.bootstrap.bootstrap_config import bootstrap_dir, is_complete
    from coevolve.training.bootstrap.build import bootstrap

    broken = saved_tiny_model(tiny_build, tmp_path / "broken-model")
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    config = BootstrapConfig(base=str(broken), max_steps=1, batch_size=2, eval_split=None)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="failed in its own process"):
        bootstrap(config, cache_dir=cache, progress=False)
    # The child's own error reached the terminal, and nothing half-built counts as an agent.
    assert "Error" in capfd.readouterr().err
    assert not is_complete(bootstrap_dir(config, cache))
    assert not list((cache / "bootstrap").glob("*.partial-*"))
