"""bench/stage_files_identical.py: the check that lets a verdict count an older commit's units."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _unit(out: Path, seconds: float, modules: list[str], weights: bytes) -> None:
    unit = out / "static-seed0"
    (unit / "cycles" / "001").mkdir(parents=True)
    (unit / "adapters" / "cycle-1").mkdir(parents=True)
    (unit / "cycles" / "001" / "rollouts.jsonl").write_text('{"score": 1.0}\n')
    train = {"steps": 2, "loss": 0.5, "train_time_s": seconds, "steps_per_s": 2 / seconds}
    (unit / "cycles" / "001" / "train.json").write_text(json.dumps(train))
    (unit / "adapters" / "cycle-1" / "adapter_config.json").write_text(
        json.dumps({"r": 8, "target_modules": modules})
    )
    (unit / "adapters" / "cycle-1" / "adapter_model.safetensors").write_bytes(weights)


def _compare(a: Path, b: Path) -> subprocess.CompletedProcess[str]:
    script = ROOT / "bench" / "stage_files_identical.py"
    return subprocess.run(
        [sys.executable, str(script), str(a), str(b), "--arms", "static"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_timings_and_the_order_of_a_set_do_not_count_and_a_changed_weight_does(tmp_path):
    _unit(tmp_path / "a", 0.70, ["q_proj", "v_proj"], b"\x01\x02")
    _unit(tmp_path / "b", 0.72, ["v_proj", "q_proj"], b"\x01\x02")
    _unit(tmp_path / "c", 0.70, ["q_proj", "v_proj"], b"\x01\x03")
    same = _compare(tmp_path / "a", tmp_path / "b")
    assert same.returncode == 0 and "static-seed0: 4 of 4 stage files identical" in same.stdout
    changed = _compare(tmp_path / "a", tmp_path / "c")
    assert changed.returncode == 1
    assert "differ: ['adapters/cycle-1/adapter_model.safetensors']" in changed.stdout
