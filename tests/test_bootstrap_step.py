"""Building a runtime never trains: the bootstrap agent a local policy starts from is built
by a step of its own (``build_bootstrap_agent``), which ``coevolve run`` calls first."""

from __future__ import annotations

import json

import pytest

from coevolve.common.errors import RunError
from coevolve.config import CoevolveConfig
from coevolve.loop.build_runtime import build_bootstrap_agent, build_runtime, local_model_dir
from coevolve.testing.presets import tiny_bootstrap
from coevolve.training.bootstrap.bootstrap_config import METADATA_FILE, bootstrap_dir


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """An empty bootstrap cache, and a bootstrap() that fakes a build (no training here)."""
    import coevolve.training.bootstrap.build as building

    monkeypatch.setenv("COEVOLVE_CACHE", str(tmp_path / "cache"))
    builds = []

    def fake_bootstrap(config, cache_dir=None, force=False, progress=True):
        target = bootstrap_dir(config, cache_dir)
        if not (target / METADATA_FILE).exists():
            builds.append(config)
            target.mkdir(parents=True)
            (target / METADATA_FILE).write_text(json.dumps({"fake": True}))
        return target

    monkeypatch.setattr(building, "bootstrap", fake_bootstrap)
    return builds


def _config(tmp_path, **changes):
    return CoevolveConfig.model_validate(
        {"run_dir": str(tmp_path / "run"), "bootstrap": tiny_bootstrap().model_dump(), **changes}
    )


def test_building_a_runtime_never_trains_a_missing_bootstrap_agent(tmp_path, empty_cache):
    config = _config(tmp_path)
    with pytest.raises(RunError, match="coevolve bootstrap --config"):
        local_model_dir(config)
    with pytest.raises(RunError, match="not built yet"):
        build_runtime(config, progress=False)
    assert empty_cache == []


def test_the_bootstrap_step_builds_once_and_says_so(tmp_path, empty_cache):
    config = _config(tmp_path)
    said: list[str] = []
    built = build_bootstrap_agent(config, say=said.append, progress=False)
    assert built == bootstrap_dir(config.bootstrap) and len(empty_cache) == 1
    assert len(said) == 1 and said[0].startswith("bootstrap: building the agent the run starts")
    assert build_bootstrap_agent(config, say=said.append, progress=False) == built
    assert len(said) == 1 and len(empty_cache) == 1  # cached: no line, no build
    assert local_model_dir(config) == built  # the runtime finds it now
    # Not the bootstrap agent: nothing to build.
    other = _config(tmp_path, policy={"kind": "local", "model": str(tmp_path)})
    assert build_bootstrap_agent(other, say=said.append) is None and len(said) == 1


def test_run_builds_the_bootstrap_agent_before_the_runtime(tmp_path, monkeypatch):
    import coevolve.runner as runner

    order: list[str] = []

    class Stop(Exception):
        pass

    def step(config, say=None, progress=True):
        order.append("bootstrap")
        assert say is not None  # the run's console hears the stage line

    def runtime(config, console=None, progress=True):
        order.append("runtime")
        raise Stop

    monkeypatch.setattr(runner, "build_bootstrap_agent", step)
    monkeypatch.setattr(runner, "build_runtime", runtime)

    class Console:
        def print(self, text: str) -> None:
            pass

    with pytest.raises(Stop):
        runner.run(_config(tmp_path), progress=False, console=Console())
    assert order == ["bootstrap", "runtime"]
