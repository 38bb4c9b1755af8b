"""DPO's knobs in one home: both agents of hard negatives train with ``training``'s DPO
step (``training.dpo.beta``, ``learning_rate``, ``max_steps``), the failure agent with
``hard_negatives.failure``'s overrides; the keys of earlier releases still load, with a
FutureWarning, to the same settings."""

from __future__ import annotations

import warnings

import pytest

from coevolve.config import CoevolveConfig, load_config
from coevolve.training.config import TrainingConfig


def earlier_release(training: TrainingConfig, beta: float, lr: float | None, steps: int | None):
    """What HardNegativeSettings.target_config / failure_config made before the move."""
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
    ("old", "target", "failure"),
    [
        # the learning bench's hard-negatives arm as it was written
        (
            {"learning_rate": 2e-5, "failure_learning_rate": 2e-5},
            (0.1, 2e-5, None),
            (0.1, 2e-5, None),
        ),
        # the target's own keys: the failure agent keeps training's rate and beta 0.1
        ({"beta": 0.2, "learning_rate": 2e-5, "max_steps": 9}, (0.2, 2e-5, 9), (0.1, None, None)),
        (
            {"failure_beta": 0.3, "failure_learning_rate": 1e-3, "failure_max_steps": 3},
            (0.1, None, None),
            (0.3, 1e-3, 3),
        ),
        # a run directory's config.yaml of earlier releases: every key written out
        (
            {
                "beta": 0.1,
                "learning_rate": None,
                "max_steps": None,
                "failure_beta": 0.1,
                "failure_learning_rate": None,
                "failure_max_steps": None,
            },
            (0.1, None, None),
            (0.1, None, None),
        ),
    ],
)
def test_keys_of_earlier_releases_load_with_a_warning_to_the_same_settings(old, target, failure):
    with pytest.warns(FutureWarning, match="hard_negatives|failure_"):
        config = load_config({"hard_negatives": {"enabled": True, **old}})
    settings, base = config.hard_negatives, config.training
    before = TrainingConfig()  # the training section as written: defaults
    assert settings.target_config(base) == earlier_release(before, *target)
    assert settings.failure_config(base) == earlier_release(before, *failure)


def test_target_keys_of_earlier_releases_do_nothing_when_hard_negatives_are_off():
    with pytest.warns(FutureWarning, match="'hard_negatives.learning_rate'"):
        config = CoevolveConfig.model_validate({"hard_negatives": {"learning_rate": 1e-5}})
    assert config.training == TrainingConfig()


def test_the_new_and_the_old_name_together_are_refused():
    with pytest.raises(ValueError, match="failure_beta"):
        load_config({"hard_negatives": {"failure_beta": 0.2, "failure": {"beta": 0.3}}})
