"""docs/loop.md's "The stages from Python" example, run as written on the tiny model.

The stages hand each other their outputs in memory: while the example runs, reading a
cycle's rollouts, flagged items or synthesized tasks back from its files fails, so a
stage that still read them would fail the test.
"""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "loop.md"


def stages_example() -> str:
    """The Python block under "## The stages from Python"."""
    section = DOCS.read_text().split("## The stages from Python", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "docs/loop.md lost its stages example"
    return match.group(1)


def test_the_stages_example_runs_on_in_memory_values(
    tmp_path, cache_dir, tiny_build, monkeypatch, capsys
):
    import coevolve.config
    from coevolve.config import CoevolveConfig
    from coevolve.run_files import CycleFiles
    from coevolve.testing.presets import tiny_bootstrap, tiny_cycle

    monkeypatch.setenv("COEVOLVE_CACHE", str(cache_dir))
    seal = {"seal": {"reweight": {"enable": True}}}
    config = CoevolveConfig.model_validate(tiny_cycle(tmp_path / "run", training=seal))
    config = config.model_copy(update={"bootstrap": tiny_bootstrap()})
    loaded: list[str] = []

    def load_config(path: str) -> CoevolveConfig:
        loaded.append(path)
        return config

    monkeypatch.setattr(coevolve.config, "load_config", load_config)

    def unread(self: CycleFiles) -> None:
        raise AssertionError("a stage read an earlier stage's output from the cycle's files")

    for reader in ("rollouts", "flagged", "synthesized"):
        monkeypatch.setattr(CycleFiles, reader, unread)

    exec(compile(stages_example(), str(DOCS), "exec"), {"__name__": "docs_loop_example"})

    assert loaded == ["configs/quickstart.yaml"]
    printed = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert len(printed) == 5 and printed[3] == "2"  # rollout success, kept, accepted, steps, eval
    run_dir = tmp_path / "run"
    assert (run_dir / "cycles" / "001" / "train.json").exists()
    assert (run_dir / "cycles" / "001" / "eval.jsonl").exists()
    assert (run_dir / "adapters" / "cycle-1" / "adapter_model.safetensors").exists()
