"""The bench's arms: what each changes in the base config, and the config of one unit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...common.config_base import merged


def _seal(reweight: bool, adaptation: bool) -> dict[str, Any]:
    """training.seal of a SEAL arm: the released code's full setting, less what it drops."""
    return {
        "reweight": {"enable": reweight, "dynamic": {"enable": reweight}},
        "adaptation": {"enable": adaptation},
    }


# The DPO + SFT arms' learning rate, tuned on validation (docs/hard-negatives.md: own-negatives,
# seed 0, one cycle, 108 validation tasks from 22.2%: 5e-4 -> 14.8%, 1e-4 -> 19.4%, 2e-5 ->
# 22.2%). The SFT arms' 5e-4 breaks the target's tool-call format within a cycle.
HARD_NEGATIVES_LEARNING_RATE = 2e-5

ARMS: dict[str, dict[str, Any]] = {
    "static": {"synthesis": {"enabled": False}},
    "random": {"signals": {"selection": "random"}},
    # synthesis by the environment's own task generator (WorldEnvironment.variant): the
    # reference a user's synthesizer is read against. The bench's base configs name it too,
    # so every arm above and below that synthesizes uses it unless it says otherwise.
    "coevolve-oracle": {"synthesis": {"synthesizer": "generator"}},
    "coevolve-paper": {"signals": {"kinds": "paper", "allocation": "per_kind"}},
    "oracle-targeted": {"signals": {"selection": "oracle"}},
    "no-forgetting": {"signals": {"kinds": ["boundary", "rare", "unsolved"]}},
    "no-boundary": {"signals": {"kinds": ["forgetting", "rare", "unsolved"]}},
    "no-rare": {"signals": {"kinds": ["forgetting", "boundary", "unsolved"]}},
    "no-unsolved": {"signals": {"kinds": ["forgetting", "boundary", "rare"]}},
    # SEAL (training/seal.py, envs/adaptation.py): GRPO with the same optimisation steps;
    # grpo is the vanilla-RL baseline SEAL is compared with.
    "grpo": {"training": {"algorithm": "grpo"}},
    # GRPO where the gradient is: tasks likely to give groups with spread, the rest refilled.
    "grpo-spread": {
        "training": {"algorithm": "grpo", "grpo": {"prompts": "spread", "dynamic_sampling": True}}
    },
    # The two ways to feed the tasks no rollout solved (issue 34, chosen on validation): SFT
    # steps on their reference solutions before GRPO, or the reference episode in the group.
    "grpo-demonstrations": {"training": {"algorithm": "grpo", "grpo": {"demonstration_steps": 4}}},
    "grpo-reference": {"training": {"algorithm": "grpo", "grpo": {"reference_episodes": True}}},
    "seal": {"training": {"algorithm": "grpo", "seal": _seal(reweight=True, adaptation=True)}},
    "seal-no-reweighting": {
        "training": {"algorithm": "grpo", "seal": _seal(reweight=False, adaptation=True)}
    },
    "seal-no-adaptation": {
        "training": {"algorithm": "grpo", "seal": _seal(reweight=True, adaptation=False)}
    },
    # Co-Evolving Agents (training/hard_negatives/agents.py): DPO + SFT target with failure-agent negatives,
    "hard-negatives": {
        "hard_negatives": {"enabled": True},
        "training": {"learning_rate": HARD_NEGATIVES_LEARNING_RATE},
    },
    # and the same objective on the target's own failures only.
    "own-negatives": {
        "hard_negatives": {"enabled": True, "failure_agent": False, "failure_share": 0.0},
        "training": {"learning_rate": HARD_NEGATIVES_LEARNING_RATE},
    },
}

# Variations of the flagged task (issue 85): the user's path on any environment, no model and
# no task generator. The bench's base configs name the generator (the arms above keep the
# meaning they were measured with); these arms switch to variations and leave the
# generator's exploration knob at its default, which variations do not read.
_VARIATION_SYNTHESIS = {"synthesizer": "variation", "roles": {"explorer_policy_rounds": None}}
ARMS["coevolve-variation"] = {"synthesis": _VARIATION_SYNTHESIS}
ARMS["random-variation"] = {"signals": {"selection": "random"}, "synthesis": _VARIATION_SYNTHESIS}


def check_arms(arms: list[str]) -> None:
    """ValueError naming each arm that is not one."""
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown:
        raise ValueError(f"unknown arms {unknown}; allowed: {', '.join(ARMS)}")


# What a seed varies besides training (arm_config's seed_sets).
SEED_SETS = ("fixed", "per-seed")

# The arms' own step counts (grpo.demonstration_steps above) are written for the bench's
# configs/bench-learning.yaml, which trains this many optimisation steps a cycle.
ARM_STEPS_WRITTEN_FOR = 16
# Keys of an arm's changes that count optimisation steps out of training.max_steps.
_STEP_KEYS = frozenset({"demonstration_steps", "max_steps", "failure_max_steps"})


def steps_scaled(changes: dict[str, Any], max_steps: int) -> dict[str, Any]:
    """An arm's changes with every step count scaled from ``ARM_STEPS_WRITTEN_FOR`` steps a
    cycle to ``max_steps`` (at least 1, and leaving at least one step for the rest), so a
    base with fewer steps (``bench learning --quick``) still runs every arm."""
    scaled: dict[str, Any] = {}
    for key, value in changes.items():
        if isinstance(value, dict):
            scaled[key] = steps_scaled(value, max_steps)
        elif key in _STEP_KEYS and isinstance(value, int) and value > 0:
            share = round(value * max_steps / ARM_STEPS_WRITTEN_FOR)
            scaled[key] = max(1, min(share, max_steps - 1))
        else:
            scaled[key] = value
    return scaled


def arm_config(
    base: dict[str, Any],
    arm: str,
    seed: int,
    out_dir: Path,
    scale_steps: bool = False,
    seed_sets: str = "fixed",
    over_arms: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The base config with the arm's changes, the seed and its own run directory.

    ``over_arms``: sections laid over the arm's changes (``bench learning --arm-set``), where
    ``--set`` changes the base beneath them: a value an arm sets itself (the model arms'
    ``pool.synthesized_weight``) is tuned this way.
    ``scale_steps``: the arm's step counts scaled to the base's ``training.max_steps``
    (``steps_scaled``); off, they are taken as written, so finished units keep their config.
    ``seed_sets``: ``fixed`` (every seed learns from the base's seed set, from one bootstrap
    agent, and is measured on one held-out set: an interval covers training seeds only) or
    ``per-seed`` (seed s draws its tasks from the environment's generator seed s,
    ``env.seed``: its own seed subset, its own bootstrap agent built on it,
    ``bootstrap.world_seed``, and its own held-out draw, so an interval covers those too).
    """
    if seed_sets not in SEED_SETS:
        raise ValueError(f"seed_sets {seed_sets!r}: one of {', '.join(SEED_SETS)}")
    changes = ARMS[arm]
    if scale_steps:
        max_steps = int(base.get("training", {}).get("max_steps", ARM_STEPS_WRITTEN_FOR))
        changes = steps_scaled(changes, max_steps)
    config = merged(merged(json.loads(json.dumps(base)), changes), over_arms or {})
    config["seed"] = seed
    config["pool"] = {**config.get("pool", {}), "seed": seed}
    config["training"] = {**config.get("training", {}), "seed": seed}
    config["run_dir"] = str(out_dir / f"{arm}-seed{seed}")
    if seed_sets == "per-seed":
        config["env"] = {**config.get("env", {}), "seed": seed}
        config["bootstrap"] = {**config.get("bootstrap", {}), "world_seed": seed}
    return config
