"""The tiny model's presets, kept as YAML in training/presets/ so the production config
classes carry no test presets. Production commands read them (``coevolve bootstrap
--tiny``, ``coevolve bench learning --quick``), and so do the tests, through
``coevolve.testing.presets``.

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
    from .bootstrap.bootstrap_config import BootstrapConfig
    from .config import TrainingConfig

PRESETS_DIR = Path(__file__).resolve().parent / "presets"


def load_preset(name: str) -> dict[str, Any]:
    """The mapping in ``training/presets/{name}.yaml``."""
    import yaml

    path = PRESETS_DIR / f"{name}.yaml"
    values = yaml.safe_load(path.read_text())
    if not isinstance(values, dict):
        raise ValueError(f"{path}: a preset's top level must be a mapping")
    return values


def tiny_bootstrap(**overrides: Any) -> BootstrapConfig:
    """The tiny test model's BootstrapConfig (bootstrap-tiny.yaml), with ``overrides``."""
    from .bootstrap.bootstrap_config import BootstrapConfig

    return BootstrapConfig.model_validate({**load_preset("bootstrap-tiny"), **overrides})


def tiny_training(**overrides: Any) -> TrainingConfig:
    """A few steps on small batches (training-tiny.yaml), with ``overrides``."""
    from .config import TrainingConfig

    return TrainingConfig.model_validate(merged(load_preset("training-tiny"), overrides))


def quick_bench() -> dict[str, Any]:
    """The config sections of ``bench learning --quick`` (bench-quick.yaml), bootstrap
    section included (the tiny model, in full)."""
    return {**load_preset("bench-quick"), "bootstrap": tiny_bootstrap().model_dump(mode="json")}
