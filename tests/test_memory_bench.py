"""bench/memory.py --quick runs one cycle on the tiny model and prints every stage's figures.

Only that it runs and reports: memory and seconds vary by machine, so nothing here
asserts a figure."""

import os
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "memory.py"
STAGES = ("bootstrap", "load", "rollout", "signals", "synthesis", "pool", "train", "evaluate")


def test_memory_bench_prints_a_peak_for_every_stage(tiny_build, cache_dir, tmp_path):
    # tiny_build: the session's tiny model, which the bench finds in the same cache.
    env = {**os.environ, "COEVOLVE_CACHE": str(cache_dir), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--threads", "1", "--keep", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout.split("stage ", 1)[1]
    for stage in STAGES:
        row = re.search(rf"^{stage}\s+(\d+\.\d)\s+(\d+\.\d\d)\s", table, re.MULTILINE)
        assert row, f"no figures for {stage}:\n{out.stdout}"
        assert float(row.group(2)) > 0  # a peak resident size was read
    assert "highest peak of any stage" in out.stdout
    assert re.search(r"success \d+/\d+", out.stdout)


def test_memory_bench_evaluate_only_takes_config_overrides(tiny_build, cache_dir, tmp_path):
    env = {**os.environ, "COEVOLVE_CACHE": str(cache_dir), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(BENCH), "--quick", "--threads", "1", "--evaluate-only"]
    out = subprocess.run(
        [*command, "--set", "policy.batch_size=2", "--keep", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout.split("stage ", 1)[1]
    ran = re.findall(r"^([a-z]+)\s+\d+\.\d\s", table, re.MULTILINE)
    assert ran == ["bootstrap", "load", "evaluate"]
    assert re.search(r"success \d+/\d+", out.stdout)

    wrong = subprocess.run(
        [*command, "--set", "policy.batch_sise=2"], capture_output=True, text=True, env=env
    )
    assert wrong.returncode != 0
    assert "batch_sise" in wrong.stderr
