"""DPO's knobs in one home: both agents of hard negatives train with ``training``'s DPO
step (``training.dpo.beta``, ``learning_rate``, ``max_steps``), the failure agent with
``hard_negatives.failure``'s overrides; the keys of earlier releases are refused."""

from __future__ import annotations

import warnings

import pytest

from coevolve.config import ConfigError, load_config
from coevolve.training.config import TrainingConfig


def earlier_release(training: TrainingConfig, beta: float, lr: float | None, steps: int | None):
    """What HardNegativeConfig.target_config / failure_config made before the move."""
    return training.model_copy(
        update={
            "algorithm": "dpo",
            "dpo": training.dpo.model_copy(update={"beta": beta}),
            "learning_rate": lr or training.learning_rate,
            "max_steps": steps or training.max_steps,
        }
    )


@pytest.mark.parametrize(
    "training", [{}, {"learning_rate": 2e-5, "max_steps": 7}, {"algorithm": "grpo"}]
)
def test_default_hard_negatives_train_both_agents_as_before(training):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        config = load_config({"hard_negatives": {"enabled": True}, "training": training})
    settings, base = config.hard_negatives, config.training
    # the defaults of earlier releases: beta 0.1 for both, training's rate and steps
    assert settings.target_config(base) == earlier_release(base, 0.1, None, None)
    assert settings.failure_config(base) == earlier_release(base, 0.1, None, None)


def test_the_failure_agent_overrides_only_what_differs():
    config = load_config(
        {
            "hard_negatives": {"enabled": True, "failure": {"beta": 0.3, "max_steps": 4}},
            "training": {"dpo": {"beta": 0.2}, "learning_rate": 1e-4},
        }
    )
    settings, base = config.hard_negatives, config.training
    assert settings.target_config(base) == earlier_release(base, 0.2, None, None)
    assert settings.failure_config(base) == earlier_release(base, 0.3, 1e-4, 4)


@pytest.mark.parametrize(
    "old", ["beta", "learning_rate", "max_steps", "failure_beta", "failure_learning_rate"]
)
def test_keys_of_earlier_releases_are_refused(old):
    with pytest.raises(ConfigError, match=f"unknown key 'hard_negatives.{old}'"):
        load_config({"hard_negatives": {"enabled": True, old: 0.1}})
