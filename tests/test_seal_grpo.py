"""SEAL's advantage reweighting: exact numbers, the dynamic EMA, and a real TRL GRPO step."""

from __future__ import annotations

import time

import pytest
import torch

from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.testing.presets import tiny_training
from coevolve.training.config import TrainingConfig
from coevolve.training.seal import (
    CapabilityState,
    ReweightConfig,
    example_weights,
    reweight_step,
    scale_advantages,
    trajectory_weight,
)

ON = ReweightConfig(enable=True)


def _group_advantages(rewards):
    """GRPO's group-normalised advantage, as TRL computes it (std-scaled, eps 1e-4)."""
    r = torch.tensor(rewards)
    return ((r - r.mean()) / (r.std() + 1e-4)).tolist()


def test_trajectory_weights_are_seal_table_6():
    assert (
        trajectory_weight(["pass", "pass", "state_mismatch", "empty_turn_model_response"], ON)
        == 1.125
    )
    assert trajectory_weight(["correct_abstention", "pass", "pass"], ON) == pytest.approx(3.8 / 3)
    assert trajectory_weight(["spurious_tool_call", "pass"], ON) == 1.5
    assert trajectory_weight(["instance_mismatch"], ON) == 0.6
    assert trajectory_weight(["response_mismatch", "gt_error", "checker_error"], ON) == 0.9
    assert trajectory_weight(["gt_error"], ON) == 1.0 and trajectory_weight([], ON) == 1.0
    assert trajectory_weight(["something_new"], ON) == 1.0  # default weight
    clamped = ReweightConfig(enable=True, tag_weights={"pass": 0.1, "spurious_tool_call": 5.0})
    assert trajectory_weight(["pass"], clamped) == 0.5
    assert trajectory_weight(["spurious_tool_call"], clamped) == 2.0


def test_reweighted_advantages_exact():
    rewards = [1.0, 0.0, 0.0, 0.0]
    labels = [
        ["pass"],  # 1.0
        ["spurious_tool_call", "spurious_tool_call"],  # 2.0
        ["instance_mismatch"],  # 0.6
        ["pass", "pass", "state_mismatch", "empty_turn_model_response"],  # 1.125
    ]
    advantages = _group_advantages(rewards)
    weights = reweight_step(CapabilityState(), ON, labels, rewards)
    assert weights == [1.0, 2.0, 0.6, 1.125]
    scaled = scale_advantages(advantages, weights)
    assert scaled == [a * w for a, w in zip(advantages, weights, strict=True)]
    assert all((a > 0) == (s > 0) for a, s in zip(advantages, scaled, strict=True))
    # a group whose episodes all score the same has nothing to reweight
    assert scale_advantages(_group_advantages([0.0] * 4), weights) == [0.0] * 4
    # only the positive (or negative) advantages
    positive = scale_advantages(advantages, weights, "positive_advantage")
    assert positive == [advantages[0] * 1.0, *advantages[1:]]
    negative = scale_advantages(advantages, weights, "negative_advantage")
    assert negative == [
        advantages[0],
        advantages[1] * 2.0,
        advantages[2] * 0.6,
        advantages[3] * 1.125,
    ]


def test_dynamic_update_exact():
    settings = ReweightConfig(enable=True, dynamic={"enable": True})
    state = CapabilityState()
    # 40 argument_mismatch labels at reward 0 among 100 labels (60 pass at reward 1)
    labels = [["argument_mismatch"]] * 40 + [["pass"]] * 60
    rewards = [0.0] * 40 + [1.0] * 60
    reweight_step(state, settings, labels, rewards)
    # target = min(2, 1.5 x (1 + 0.4 x 1 x 1)) = 2.0; EMA 0.75 x 1.5 + 0.25 x 2.0
    assert state.weights["argument_mismatch"] == pytest.approx(1.625)
    assert state.weights["pass"] == 1.0
    # an unseen label's target is its base: unchanged
    assert state.weights["spurious_tool_call"] == 2.0
    # low confidence: 8 of 32 samples, prevalence 8/10, reward mean 0.5
    small = CapabilityState()
    small.observe([["state_mismatch"]] * 8 + [["pass"]] * 2, [0.5] * 8 + [1.0] * 2)
    small.update_dynamic(settings)
    target = 1.0 * (1 + 1.0 * 0.8 * 0.5 * (8 / 32))
    assert small.weights["state_mismatch"] == pytest.approx(0.75 * 1.0 + 0.25 * target)
    # the window resets each cycle; totals stay; an empty window falls back to the totals
    state.reset_window()
    assert state.window == {} and state.total["argument_mismatch"].count == 40
    before = state.weights["argument_mismatch"]
    state.update_dynamic(settings)
    assert state.weights["argument_mismatch"] == pytest.approx(0.75 * before + 0.25 * 2.0)


def test_capability_state_round_trip(tmp_path):
    state = CapabilityState()
    state.observe([["pass", "state_mismatch"]], [0.0])
    state.save(tmp_path / "capability_state.json")
    assert CapabilityState.load(tmp_path / "capability_state.json") == state
    assert CapabilityState.load(tmp_path / "missing.json") == CapabilityState()


def test_sft_example_weights():
    labels = [["pass"], ["correct_abstention", "pass"], ["gt_error"]]
    assert example_weights(labels, ON) == [1.0, 1.4, 1.0]
    assert example_weights(labels, ReweightConfig()) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"enable": True, "min_scale": 3.0}, "min_scale <= max_scale"),
        ({"enable": True, "tag_weights": {"pass": 0.0}}, "must be positive"),
        ({"enable": True, "tag_weights": {"passs": 1.0}}, "unknown diagnosis labels"),
        ({"enable": True, "tag_weights": {"gt_error": 1.0}}, "excluded"),
        ({"dynamic": {"enable": True}}, "set enable: true"),
    ],
)
def test_settings_reject_bad_combinations(values, message):
    with pytest.raises(ValueError, match=message):
        ReweightConfig.model_validate(values)


def test_training_config_takes_reweighting_for_grpo_and_sft_only():
    with pytest.raises(ValueError, match="set algorithm: grpo or sft"):
        TrainingConfig(algorithm="dpo", seal={"reweight": {"enable": True}})
    # SFT takes the weights per example, from the fixed table.
    assert TrainingConfig(algorithm="sft", seal={"reweight": {"enable": True}}).seal.reweight.enable
    with pytest.raises(ValueError, match=r"dynamic\.enable: false"):
        TrainingConfig(
            algorithm="sft", seal={"reweight": {"enable": True, "dynamic": {"enable": True}}}
        )
    for name, field in ReweightConfig.model_fields.items():
        assert field.description, name


# --------------------------------------------------------------------------- a real GRPO step


def test_seal_grpo_step_scales_trl_advantages(tiny_build, tmp_path):
    from coevolve.common.tokenization import load_tokenizer
    from coevolve.training.grpo.grpo_trainer import make_grpo_trainer
    from coevolve.training.trainers import common_arguments

    config = tiny_training(
        algorithm="grpo",
        max_steps=1,
        seal={
            "reweight": {"enable": True, "dynamic": {"enable": True}},
            "adaptation": {"enable": True, "recovery_hints": True},
        },
    )
    tasks = load_split("train")[:2]
    state = CapabilityState()
    trainer, examples, reason = make_grpo_trainer(
        config,
        model_dir=tiny_build,
        previous_adapter=None,
        tokenizer=load_tokenizer(tiny_build),
        tasks=tasks,
        make_env=WorldEnvironment,
        system_prompt="Use the tools.",
        arguments=common_arguments(config, "cpu", tmp_path, progress=False),
        capability_state=state,
    )
    assert reason is None and examples == 2
    assert type(trainer).__name__ == "SealGRPOTrainer" and trainer.capability_state is state
    row = trainer.train_dataset[0]
    assert "Observation note" in row["prompt"][0]["content"]  # the training interface
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    episodes = config.grpo.prompts_per_step * config.grpo.num_generations
    assert len(trainer.last_seal_labels) == episodes
    assert all(labels for labels in trainer.last_seal_labels)  # every world episode diagnosed
    assert sum(s.count for s in state.total.values()) == sum(map(len, trainer.last_seal_labels))
    assert trainer.last_seal_weights == [
        trajectory_weight(labels, config.seal.reweight, state)
        for labels in trainer.last_seal_labels
    ]
    assert state.updates == 1
    # exact scaling of TRL's own advantages on one more generation batch
    trainer.model.train()
    batch = [trainer.train_dataset[i % 2] for i in range(episodes)]
    output = trainer._generate_and_score_completions(batch)
    raw = list(trainer._logs["advantages"])[-episodes:]
    expected = [a * w for a, w in zip(raw, trainer.last_seal_weights, strict=True)]
    assert output["advantages"].tolist() == pytest.approx(expected, abs=1e-6)
    print(f"\nSEAL GRPO step on the tiny model: {seconds:.2f} s ({episodes} episodes)")
