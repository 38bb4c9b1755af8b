"""Every script in examples/ runs as the docs say (the training one on the tiny test model)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, cwd: Path, env: dict[str, str] | None = None):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_every_example_script_has_a_test():
    tested = {"world_episode.py", "closed_loop.py"}
    assert {path.name for path in EXAMPLES.glob("*.py")} == tested


def test_world_episode_example(tmp_path):
    out = run_example("world_episode.py", cwd=tmp_path)
    assert "user:" in out and "call: fly_to_moon()" in out
    assert out.rstrip().endswith("verifier score: 1.0")


@pytest.mark.slow
def test_closed_loop_example_on_the_tiny_model(tmp_path, cache_dir, tiny_build):
    env = {"COEVOLVE_CACHE": str(cache_dir)}
    out = run_example("closed_loop.py", "--quick", cwd=tmp_path, env=env)
    assert "cycle 1: held-out success" in out and "cycle 2: held-out success" in out
    assert (tmp_path / "runs" / "example").is_dir()
    again = run_example("closed_loop.py", "--resume", cwd=tmp_path, env=env)
    assert "cycle 2: held-out success" in again
