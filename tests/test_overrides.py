"""``--set KEY=VALUE`` overrides: typed by the config schema, unknown keys answered with a
suggestion as in YAML, on `coevolve run`, `coevolve config show` and `coevolve bench`.

That the overrides are recorded in a run's saved config is checked by the
two-cycle run in tests/test_tracking.py (a run is too slow to repeat here).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from coevolve.config import ConfigError, apply_overrides, load_config, parse_override


def coevolve(*args):
    return subprocess.run(
        [sys.executable, "-m", "coevolve", *args], capture_output=True, text=True, timeout=300
    )


def test_values_are_typed_by_the_schema(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("cycles: 2\ntraining:\n  max_steps: 50\n  batch_size: 4\n")
    config = load_config(
        path,
        [
            "training.max_steps=10",
            "rollout.k=8",
            "rollout.temperature=0.5",
            "synthesis.enabled=false",
            "signals.kinds=[rare]",
            "run_dir=runs/over ridden",
            "policy.adapter=",
        ],
    )
    assert config.training.max_steps == 10 and config.training.batch_size == 4  # kept
    assert config.cycles == 2 and config.rollout.k == 8 and config.rollout.temperature == 0.5
    assert config.synthesis.enabled is False and config.signals.kinds == ["rare"]
    assert config.run_dir == "runs/over ridden" and config.policy.adapter is None
    # later settings win; defaults work without a file
    assert load_config(None, ["cycles=2", "cycles=5"]).cycles == 5


def test_named_entries_and_inline_sections():
    config = load_config(
        None,
        [
            "endpoints.main.base_url=http://127.0.0.1:8000/v1",
            "endpoints.main.model=qwen",
            "endpoints.main.max_reply_chars=4000",
            "synthesis.synthesizer=llm",
            "synthesis.roles.default_endpoint=main",
        ],
    )
    assert config.endpoints["main"].model == "qwen"
    assert config.endpoints["main"].reply_limit() == 4000
    assert config.synthesis.roles.default_endpoint == "main"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("training.max_step=10", ["unknown key 'training.max_step'", "did you mean 'max_steps'"]),
        ("trainig.max_steps=10", ["unknown key 'trainig'", "did you mean 'training'"]),
        (
            "endpoints.main.bse_url=x",
            ["unknown key 'endpoints.main.bse_url'", "did you mean 'base_url'"],
        ),
        ("rollout.k.x=1", ["rollout.k is a value, not a section"]),
        ("training.max_steps=ten", ["training.max_steps", "valid integer"]),
        ("env.name=wrld", ["env", "unknown environment 'wrld'", "allowed: world, bfcl"]),
        ("max_steps", ["expected KEY=VALUE"]),
        ("rollout.k=[1", ["not valid YAML", "quote it"]),
    ],
)
def test_mistakes_say_what_to_change(override, expected):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    for text in expected:
        assert text in str(info.value), str(info.value)


def test_overrides_do_not_touch_the_input():
    data = {"training": {"max_steps": 3}}
    assert apply_overrides(data, ["training.max_steps=4"]) == {"training": {"max_steps": 4}}
    assert data == {"training": {"max_steps": 3}}
    assert parse_override("a.b={x: 1}") == (["a", "b"], {"x": 1})


def test_config_show_takes_set():
    shown = coevolve("config", "show", "--set", "training.max_steps=10", "--set", "rollout.k=3")
    assert shown.returncode == 0, shown.stderr
    config = yaml.safe_load(shown.stdout)
    assert config["training"]["max_steps"] == 10 and config["rollout"]["k"] == 3
    bad = coevolve("config", "show", "--set", "rollout.kk=3")
    assert bad.returncode == 2 and "did you mean 'k'" in bad.stderr


def test_run_and_bench_take_set_and_refuse_unknown_keys(tmp_path):
    run = coevolve("run", "--set", "trainng.max_steps=1", "--run-dir", str(tmp_path / "r"))
    assert run.returncode == 2 and "did you mean 'training'" in run.stderr, run.stderr
    assert not (tmp_path / "r").exists()  # refused before anything started
    bench = coevolve(
        "bench", "learning", "--quick", "--set", "rollout.kk=1", "--out", str(tmp_path / "b")
    )
    assert bench.returncode == 2 and "did you mean 'k'" in bench.stderr, bench.stderr
    resumed = coevolve("run", "--resume", str(tmp_path / "r"), "--set", "cycles=1")
    assert resumed.returncode == 2 and "--set" in resumed.stderr
