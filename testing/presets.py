"""Small settings for tests and seconds-long checks, kept as YAML in testing/presets/ so
the production config classes carry no test presets.

- ``tiny_bootstrap()``: the from-scratch tiny model (``base: tiny``), built in seconds;
  it learns nothing useful (``coevolve bootstrap --tiny``, the test suite).
- ``tiny_training()``: a few LoRA steps on small batches, for tests with that model.
- ``quick_bench()``: the sections ``coevolve bench learning --quick`` replaces in its
  base config.

Keyword overrides replace whole top-level fields, as a config dict would.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..common.config_base import merged

if TYPE_CHECKING:  # pragma: no cover
    from ..training.bootstrap_config import BootstrapConfig
    from ..training.config import TrainingConfig

PRESETS_DIR = Path(__file__).resolve().parent / "presets"


def load_preset(name: str) -> dict[str, Any]:
    """The mapping in ``testing/presets/{name}.yaml``."""
    import yaml

    path = PRESETS_DIR / f"{name}.yaml"
    values = yaml.safe_load(path.read_text())
    if not isinstance(values, dict):
        raise ValueError(f"{path}: a preset's top level must be a mapping")
    return values


def tiny_bootstrap(**overrides: Any) -> BootstrapConfig:
    """The tiny test model's BootstrapConfig (bootstrap-tiny.yaml), with ``overrides``."""
    from ..training.bootstrap_config import BootstrapConfig

    return BootstrapConfig.model_validate({**load_preset("bootstrap-tiny"), **overrides})


def tiny_training(**overrides: Any) -> TrainingConfig:
    """A few steps on small batches (training-tiny.yaml), with ``overrides``."""
    from ..training.config import TrainingConfig

    return TrainingConfig.model_validate(merged(load_preset("training-tiny"), overrides))


def quick_bench() -> dict[str, Any]:
    """The config sections of ``bench learning --quick`` (bench-quick.yaml), bootstrap
    section included (the tiny model, in full)."""
    return {**load_preset("bench-quick"), "bootstrap": tiny_bootstrap().model_dump(mode="json")}


def endpoint_run(
    run_dir: str | Path, base_url: str, model: str, train_model: str | Path, **changes: Any
) -> dict[str, Any]:
    """A run config (as a dict) whose policy is the endpoint at ``base_url`` serving
    ``model``, trained on the local ``train_model``: small rollouts, pool, signals and
    steps, for tests of the loop against a scripted server; ``changes`` laid over it."""
    config = {
        "run_dir": str(run_dir),
        "cycles": 2,
        # The tiny model reads 1024 positions and the world's 31 tool schemas fill 5k: the
        # prompts carry none (the endpoint default would send and train them).
        "policy": {
            "kind": "endpoint",
            "endpoint": "agent",
            "train_model": str(train_model),
            "tools_in_prompt": False,
        },
        "endpoints": {
            "agent": {"base_url": base_url, "model": model, "concurrency": 4, "timeout_s": 20}
        },
        "rollout": {"k": 2, "max_tool_calls": 6},
        "pool": {"rollout_tasks": 24, "replay_demonstrations": 4},
        "signals": {"rare_min_observations": 8, "budget": 6},
        "synthesis": {"max_concurrency": 1},
        "training": {"max_steps": 2, "batch_size": 2},
        "evaluation": {"per_family": 1},
    }
    return merged(config, changes)
