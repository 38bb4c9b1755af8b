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


def memory_bench(cache_dir, *arguments: str) -> subprocess.CompletedProcess:
    """The bench on the tiny model, which it finds in the session's cache (tiny_build)."""
    env = {**os.environ, "COEVOLVE_CACHE": str(cache_dir), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(BENCH), "--quick", "--threads", "1", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)


def stages_run(stdout: str) -> list[str]:
    table = stdout.split("stage ", 1)[1]
    return re.findall(r"^([a-z]+)\s+\d+\.\d\s+\d+\.\d\d\s", table, re.MULTILINE)


def test_memory_bench_prints_a_peak_for_every_stage(tiny_build, cache_dir, tmp_path):
    out = memory_bench(cache_dir, "--keep", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout.split("stage ", 1)[1]
    for stage in STAGES:
        row = re.search(rf"^{stage}\s+(\d+\.\d)\s+(\d+\.\d\d)\s", table, re.MULTILINE)
        assert row, f"no figures for {stage}:\n{out.stdout}"
        assert float(row.group(2)) > 0  # a peak resident size was read
    assert stages_run(out.stdout) == list(STAGES)
    assert "highest peak of any stage" in out.stdout
    assert re.search(r"success \d+/\d+", out.stdout)


def test_memory_bench_evaluate_only_takes_config_overrides(tiny_build, cache_dir, tmp_path):
    out = memory_bench(
        cache_dir, "--evaluate-only", "--set", "policy.batch_size=2", "--keep", str(tmp_path / "r")
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert stages_run(out.stdout) == ["bootstrap", "load", "evaluate"]
    assert re.search(r"success \d+/\d+", out.stdout)

    wrong = memory_bench(cache_dir, "--evaluate-only", "--set", "policy.batch_sise=2")
    assert wrong.returncode != 0
    assert "batch_sise" in wrong.stderr
