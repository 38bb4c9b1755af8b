"""Settings for tests: the tiny model's presets (``tiny_bootstrap``, ``tiny_training``,
``quick_bench``, ``load_preset``; they live in ``coevolve.training.tiny_presets``, where
production commands read them too), one small cycle on the tiny model
(``tiny_cycle``) and a run config against a scripted endpoint (``endpoint_run``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..common.config_base import merged
from ..training.tiny_presets import (
    PRESETS_DIR,
    load_preset,
    quick_bench,
    tiny_bootstrap,
    tiny_training,
)

__all__ = [
    "PRESETS_DIR",
    "endpoint_run",
    "load_preset",
    "quick_bench",
    "tiny_bootstrap",
    "tiny_cycle",
    "tiny_training",
]


def tiny_cycle(run_dir: str | Path, training: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run config (as a dict) of one small cycle (6 tasks x 2 rollouts, 2 training steps of
    2, one held-out task a family); ``training`` laid over its section. Give it the tiny
    bootstrap model with ``.model_copy(update={"bootstrap": tiny_bootstrap()})``."""
    return {
        "run_dir": str(run_dir),
        "cycles": 1,
        "rollout": {"k": 2, "max_tool_calls": 2},
        "policy": {"max_new_tokens": 16},
        "pool": {"rollout_tasks": 6, "replay_demonstrations": 4},
        "training": merged({"max_steps": 2, "batch_size": 2}, training or {}),
        "evaluation": {"per_family": 1},
    }


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
