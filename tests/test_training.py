"""The training step: config checks, dataset builders, and one LoRA step per TRL trainer.

Uses the tiny bootstrap build (same cache directory as the other tests) and
2-step trainings; nothing depends on what the model learns. GRPO's reward
comes from a stub environment whose score varies with the answer's length, so
every group has reward spread and the adapter must move.
"""

from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from coevolve.agents.policy.conversation import reference_conversation
from coevolve.agents.policy.local_policy import LocalPolicy
from coevolve.envs.base import tool_schema
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.records import Observation, Task, Trajectory, Turn
from coevolve.testing.presets import tiny_training
from coevolve.training.config import LoraAdapterConfig, TrainingConfig
from coevolve.training.datasets import (
    demonstrations,
    preference_pairs,
    split_opening,
    successful_conversations,
)
from coevolve.training.grpo.environment import environment_class, environment_score
from coevolve.training.sft_trainer import sft_trainer
from coevolve.training.trainers import (
    ADAPTER_MARKER,
    is_adapter_complete,
    length_grouped_order,
    load_train_result,
    load_trainable_model,
    train_adapter,
)


@pytest.fixture(scope="module")
def tasks():
    return load_split("train")[:6]


def _trajectory(task: Task, messages, score: float, index: int = 0, **extra) -> Trajectory:
    return Trajectory(
        id=f"{task.id}-{index}",
        task_id=task.id,
        env="world",
        family=task.family,
        messages=messages,
        score=score,
        rollout_index=index,
        **extra,
    )


def _failed(messages):
    """The reference conversation with its final answer replaced: a failure of the same task."""
    return [*messages[:-1], {"role": "assistant", "content": "I could not do it."}]


@pytest.fixture(scope="module")
def trajectories(tasks):
    out = []
    for task in tasks:
        messages, score = reference_conversation(WorldEnvironment(), task)
        assert score == 1.0
        out += [
            _trajectory(task, messages, 1.0, 0),
            _trajectory(task, messages, 1.0, 1),  # duplicate success
            _trajectory(task, _failed(messages), 0.0, 2),
            _trajectory(task, messages[:3], 0.0, 3, finished=False),  # cut off
        ]
    return out


# --------------------------------------------------------------------------- config


def test_config_defaults_and_peft():
    config = TrainingConfig()
    assert config.algorithm == "sft"
    lora = config.lora.to_peft()
    assert lora.r == 16 and lora.lora_alpha == 32
    assert set(lora.target_modules) >= {"q_proj", "v_proj", "down_proj"}
    for name, field in TrainingConfig.model_fields.items():
        assert field.description, f"{name} has no description"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"algorithm": "grpo", "batch_size": 5}, "batch_size (5) must divide"),
        ({"grpo": {"epsilon": 0.3, "epsilon_high": 0.2}}, "grpo.epsilon_high (0.2) is below"),
        (
            {"algorithm": "grpo", "lora": {"target_modules": ["q_proj", "lm_head"]}},
            "remove 'lm_head'",
        ),
        (
            {"algorithm": "grpo", "max_length": 256, "grpo": {"max_completion_length": 300}},
            "lower it or raise max_length",
        ),
        ({"learning_rat": 1e-4}, "Extra inputs are not permitted"),
        (
            {"algorithm": "dpo", "seal": {"reweight": {"enable": True}}},
            "set algorithm: grpo or sft",
        ),
        (
            {"seal": {"reweight": {"enable": True, "dynamic": {"enable": True}}}},
            "dynamic.enable: false",
        ),
    ],
)
def test_config_rejects_bad_combinations(values, message):
    with pytest.raises(ValidationError) as info:
        TrainingConfig.model_validate(values)
    assert message in str(info.value)


# --------------------------------------------------------------------------- datasets


def test_successful_conversations_cap_dedup_and_filter(tasks, trajectories):
    conversations = successful_conversations(trajectories, max_per_task=2)
    # the duplicate success counts once, failures and cut-off episodes never
    assert len(conversations) == len(tasks)
    assert all(c[-1]["content"] != "I could not do it." for c in conversations)
    different = [
        _trajectory(
            tasks[0],
            [*_failed(trajectories[0].messages)[:-1], {"role": "assistant", "content": "ok"}],
            1.0,
            9,
        )
    ]
    assert len(successful_conversations(trajectories + different, max_per_task=1)) == len(tasks)
    assert len(successful_conversations(trajectories + different, max_per_task=2)) == len(tasks) + 1
    errored = [t.model_copy(update={"error": "endpoint failed"}) for t in trajectories]
    assert successful_conversations(errored, max_per_task=2) == []


def test_preference_pairs_are_same_task_success_vs_failure(tasks, trajectories):
    pairs = preference_pairs(trajectories, max_per_task=2)
    assert len(pairs) == len(tasks)  # one distinct success, one distinct failure each
    by_id = {t.id: t for t in trajectories}
    for pair in pairs:
        success = by_id[f"{pair.task_id}-0"]
        opening, rest = split_opening(success.messages)
        assert pair.prompt == opening and pair.chosen == rest
        assert pair.rejected[-1]["content"] == "I could not do it."
        assert pair.prompt[-1]["role"] == "user"
        for message in pair.chosen + pair.rejected:
            for call in message.get("tool_calls", []):
                assert isinstance(call["function"]["arguments"], str)  # JSON strings, not dicts
    # no pairs across tasks: successes of one task, failures of another
    mixed = [trajectories[0], trajectories[6]]
    assert trajectories[0].task_id != trajectories[6].task_id
    assert preference_pairs(mixed, max_per_task=2) == []


def test_demonstrations_keep_only_verified(tasks):
    class Sabotaged(WorldEnvironment):
        """Every call on task 'broken' fails, so its replay does not verify."""

        def reset(self, task):
            self.broken = task.id == "broken"
            return super().reset(task)

        def step(self, action):
            return (
                Observation(text="error: down", error="tool_error")
                if self.broken
                else super().step(action)
            )

    acting = next(t for t in tasks if t.reference_answer is None and t.reference_calls)
    broken = acting.model_copy(update={"id": "broken"})
    conversations = demonstrations([*tasks[:3], broken], Sabotaged, system_prompt="sys")
    assert len(conversations) == 3
    assert all(c[0] == {"role": "system", "content": "sys"} for c in conversations)
    for conversation, task in zip(conversations, tasks, strict=False):
        env = WorldEnvironment()
        env.reset(task)
        assert conversation[1]["content"] == task.instruction


# --------------------------------------------------------------------------- helpers


def _lora_tensors(adapter: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(adapter / "adapter_model.safetensors"))


def _assert_trained(tiny_build, result, output: Path, algorithm: str):
    import torch
    from safetensors.torch import load_file

    assert result.skipped is None and result.algorithm == algorithm
    assert result.steps == 2 and result.adapter_dir == str(output)
    assert is_adapter_complete(output)
    assert load_train_result(output).steps == 2
    assert not list(output.parent.glob(".*partial*"))
    tensors = _lora_tensors(output)
    lora_b = [value for key, value in tensors.items() if "lora_B" in key]
    assert lora_b, "no LoRA weights saved"
    # LoRA B starts at zero: a non-zero B is a weight the step changed
    assert any(value.abs().max() > 0 for value in lora_b)
    # base weights are untouched: the adapter holds only LoRA tensors, the model file is unchanged
    assert all("lora_" in key for key in tensors)
    base = load_file(str(tiny_build / "model.safetensors"))
    state = load_trainable_model(tiny_build, output).get_base_model().state_dict()
    for key, value in base.items():
        stem, _, kind = key.rpartition(".")
        name = key if key in state else f"{stem}.base_layer.{kind}"
        assert torch.equal(state[name], value), key
    # the adapter loads in the in-process policy and generates
    policy = LocalPolicy(tiny_build, max_new_tokens=4)
    policy.reload_adapter(output)
    messages, _ = reference_conversation(WorldEnvironment(), load_split("validation")[0])
    reply = policy.generate_sync([messages[:2]])[0]
    assert reply.error is None and policy.version.endswith(output.name)


# --------------------------------------------------------------------------- trainers


def test_sft_trains_continues_and_skips(tiny_build, trajectories, tmp_path):
    import torch

    config = tiny_training()
    conversations = successful_conversations(trajectories, max_per_task=2)
    first = tmp_path / "adapters" / "cycle-1"
    result = train_adapter(
        config,
        model_dir=tiny_build,
        output_dir=first,
        conversations=conversations,
        progress=False,
    )
    assert result.examples == len(conversations) and result.final_loss is not None
    _assert_trained(tiny_build, result, first, "sft")

    # cycle 2 starts from cycle 1's weights
    model = load_trainable_model(tiny_build, first)
    state = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    saved = _lora_tensors(first)
    assert len(state) == len(saved)
    for key, value in saved.items():
        match = [v for k, v in state.items() if k.replace(".default", "") == key]
        assert match and torch.equal(match[0], value), key
    second = tmp_path / "adapters" / "cycle-2"
    result = train_adapter(
        config,
        model_dir=tiny_build,
        output_dir=second,
        previous_adapter=first,
        conversations=conversations,
        progress=False,
    )
    assert result.previous_adapter == str(first) and is_adapter_complete(second)
    changed = _lora_tensors(second)
    assert any(not torch.equal(changed[key], saved[key]) for key in saved)

    # nothing to train on: skipped, the previous adapter stays the policy, nothing written
    third = tmp_path / "adapters" / "cycle-3"
    result = train_adapter(
        config, model_dir=tiny_build, output_dir=third, previous_adapter=second, progress=False
    )
    assert result.skipped and result.adapter_dir == str(second) and result.steps == 0
    assert not third.exists()


def test_length_grouped_order_pads_less_and_keeps_lengths_mixed_over_the_run():
    lengths = [10 + (i * 37) % 200 for i in range(64)]

    def padding(order: list[int]) -> float:
        batches = [order[i : i + 8] for i in range(0, len(order), 8)]
        padded = sum(max(lengths[i] for i in batch) * len(batch) for batch in batches)
        return padded / sum(lengths[i] for i in order)

    order = length_grouped_order(lengths, batch_size=8, rows=150, seed=0)
    assert len(order) == 150
    assert sorted(order[:64]) == list(range(64))  # a pass is every row once
    assert sorted(order[64:128]) == list(range(64))
    assert order == length_grouped_order(lengths, batch_size=8, rows=150, seed=0)
    assert order != length_grouped_order(lengths, batch_size=8, rows=150, seed=1)
    shuffled = [random.Random(s).sample(range(64), 64) for s in range(20)]
    assert padding(order[:64]) < min(padding(o) for o in shuffled)
    # Not sorted within a window the way group_by_length does: batch lengths go up and down.
    longest = [max(lengths[i] for i in order[b : b + 8]) for b in range(0, 64, 8)]
    assert longest != sorted(longest) and longest != sorted(longest, reverse=True)
    assert length_grouped_order([], batch_size=8, rows=10, seed=0) == []


def test_sft_trainer_reads_rows_in_the_length_grouped_order(tiny_build, trajectories, tmp_path):
    from coevolve.common.tokenization import load_tokenizer

    tokenizer = load_tokenizer(tiny_build)
    conversations = successful_conversations(trajectories, max_per_task=2)
    for batching in ("length_grouped", "random"):
        config = tiny_training(sft={"batching": batching})
        trainer, _, _ = sft_trainer(
            config, tiny_build, None, tokenizer, conversations, "cpu", tmp_path, False
        )
        rows = config.max_steps * config.batch_size
        lengths = [len(ids) for ids in trainer.train_dataset["input_ids"]]
        if batching == "length_grouped":
            assert len(lengths) == rows  # the order is the dataset: read in sequence
            first = next(iter(trainer.get_train_dataloader()))
            assert first["input_ids"].shape[0] == config.batch_size
            assert [int(m.sum()) for m in first["attention_mask"]] == lengths[: config.batch_size]
        else:
            assert len(lengths) == len(conversations)


def test_sft_example_weights_scale_each_example_loss(tiny_build, trajectories, tmp_path):
    """All-zero weights: zero loss and an adapter still at its start (B = 0); weights 1: trained."""
    config = tiny_training()
    conversations = successful_conversations(trajectories, max_per_task=2)
    zero = train_adapter(
        config,
        model_dir=tiny_build,
        output_dir=tmp_path / "zero",
        conversations=conversations,
        example_weights=[0.0] * len(conversations),
        progress=False,
    )
    assert zero.steps == 2 and zero.final_loss == 0.0
    lora_b = [v for k, v in _lora_tensors(tmp_path / "zero").items() if "lora_B" in k]
    assert lora_b and all(value.abs().max() == 0 for value in lora_b)
    ones = train_adapter(
        config,
        model_dir=tiny_build,
        output_dir=tmp_path / "ones",
        conversations=conversations,
        example_weights=[1.0] * len(conversations),
        progress=False,
    )
    _assert_trained(tiny_build, ones, tmp_path / "ones", "sft")
    assert ones.final_loss is not None and ones.final_loss > 0
    with pytest.raises(ValueError, match="example weights for"):
        train_adapter(
            config,
            model_dir=tiny_build,
            output_dir=tmp_path / "bad",
            conversations=conversations,
            example_weights=[1.0],
            progress=False,
        )


def test_dpo_trains(tiny_build, trajectories, tmp_path):
    pairs = preference_pairs(trajectories, max_per_task=1)
    output = tmp_path / "dpo"
    result = train_adapter(
        tiny_training(algorithm="dpo"),
        model_dir=tiny_build,
        output_dir=output,
        pairs=pairs,
        progress=False,
    )
    assert result.examples == len(pairs)
    _assert_trained(tiny_build, result, output, "dpo")
    skipped = train_adapter(
        tiny_training(algorithm="dpo"),
        model_dir=tiny_build,
        output_dir=tmp_path / "none",
        progress=False,
    )
    assert skipped.skipped and skipped.adapter_dir is None


class LengthEnvironment:
    """A stub environment: one tool, and a score that grows with the final answer's length."""

    name = "stub"

    def tools(self):
        return [
            tool_schema(
                "ping", "Ping.", {"text": {"type": "string", "description": "Text."}}, ["text"]
            )
        ]

    def reset(self, task):
        self.answer = None
        return task.instruction

    def step(self, action):
        return Observation(text="pong")

    def end_turn(self, answer=None):
        self.answer = answer
        return None

    def score(self):
        return len(self.answer) / (len(self.answer) + 20) if self.answer else 0.0

    def action_pattern(self, steps):
        return ""


def test_grpo_trains_with_environment_reward(tiny_build, tmp_path):
    tasks = [
        Task(id=f"t{i}", env="stub", family="f", turns=[Turn(query=f"say {i}")]) for i in range(2)
    ]
    output = tmp_path / "grpo"
    result = train_adapter(
        tiny_training(algorithm="grpo"),
        model_dir=tiny_build,
        output_dir=output,
        tasks=tasks,
        make_env=LengthEnvironment,
        progress=False,
    )
    assert result.examples == 2 and result.mean_reward is not None
    _assert_trained(tiny_build, result, output, "grpo")
    with pytest.raises(ValueError, match="make_env"):
        train_adapter(
            tiny_training(algorithm="grpo"),
            model_dir=tiny_build,
            output_dir=tmp_path / "x",
            tasks=tasks,
        )
    skipped = train_adapter(
        tiny_training(algorithm="grpo"),
        model_dir=tiny_build,
        output_dir=tmp_path / "y",
        make_env=LengthEnvironment,
        progress=False,
    )
    assert skipped.skipped


def _grpo_with_demonstrations(tiny_build, output, caplog, training_warmup=0.0, **grpo):
    """One GRPO step of 4 (2 of them SFT on two world tasks' demonstrations, at 5e-4; GRPO
    at 1e-4) on the stub environment: the result and the learning rates the steps logged."""
    from coevolve.envs.world import WorldEnvironment, load_split
    from coevolve.training.datasets import demonstrations
    from coevolve.training.trainer_common import TRAINER_LOGGER

    tasks = [
        Task(id=f"t{i}", env="stub", family="f", turns=[Turn(query=f"say {i}")]) for i in range(2)
    ]
    config = tiny_training(
        algorithm="grpo",
        max_steps=4,
        learning_rate=5e-4,
        warmup_ratio=training_warmup,
        grpo={"demonstration_steps": 2, "learning_rate": 1e-4, **grpo},
    )
    with caplog.at_level(logging.INFO, logger=TRAINER_LOGGER):
        result = train_adapter(
            config,
            model_dir=tiny_build,
            output_dir=output,
            tasks=tasks,
            conversations=demonstrations(load_split("train", size=2), WorldEnvironment),
            make_env=LengthEnvironment,
            progress=False,
        )
    rates = [float(rate) for rate in re.findall(r"'learning_rate': ([0-9.e-]+)", caplog.text)]
    return result, rates


def test_grpo_demonstration_steps_come_first_and_count(tiny_build, tmp_path, caplog):
    """grpo.demonstration_steps: SFT on the demonstrations it is given (the tasks no rollout
    solved), at the SFT rate, then GRPO from that adapter for the rest of max_steps at
    grpo.learning_rate; one result."""
    output = tmp_path / "grpo"
    result, rates = _grpo_with_demonstrations(tiny_build, output, caplog)
    assert result.steps == 4 and result.demonstration_steps == 2
    assert result.mean_reward is not None and result.groups is not None
    assert is_adapter_complete(output) and load_train_result(output).steps == 2  # GRPO's own
    first = load_train_result(tmp_path / "grpo-demonstrations")
    assert first.algorithm == "sft" and first.steps == 2
    # Each part starts at its own peak rate (the tiny preset has no warm-up), SFT's then
    # GRPO's, and decays from there by cosine.
    assert rates == pytest.approx([5e-4, 2.5e-4, 1e-4, 5e-5])
    with pytest.raises(ValueError, match="leaves no GRPO step"):
        tiny_training(algorithm="grpo", max_steps=2, grpo={"demonstration_steps": 2})


def test_grpo_demonstration_steps_can_end_the_cycle(tiny_build, tmp_path, caplog):
    """grpo.demonstration_order: last: GRPO first, then the SFT steps from its adapter, so the
    cycle's adapter is the SFT step's; the result keeps GRPO's figures and counts both."""
    output = tmp_path / "grpo"
    result, rates = _grpo_with_demonstrations(
        tiny_build, output, caplog, demonstration_order="last"
    )
    assert result.steps == 4 and result.demonstration_steps == 2
    assert result.algorithm == "grpo" and result.groups is not None
    assert result.adapter_dir == str(output) and load_train_result(output).algorithm == "sft"
    assert load_train_result(tmp_path / "grpo-grpo").algorithm == "grpo"
    assert not (tmp_path / "grpo-demonstrations").exists()
    assert rates == pytest.approx([1e-4, 5e-5, 5e-4, 2.5e-4])  # GRPO's, then SFT's
    with pytest.raises(ValueError, match="demonstration_order: last"):
        tiny_training(algorithm="grpo", grpo={"demonstration_order": "last"})


def test_grpo_warmup_ratio_overrides_the_warm_up_of_a_grpo_cycle(tiny_build, tmp_path, caplog):
    """grpo.warmup_ratio 0 under a training-wide warm-up: both trainers of the cycle (the
    demonstration steps and GRPO's) take their first step at their peak rate, not at 0."""
    _, warmed = _grpo_with_demonstrations(tiny_build, tmp_path / "warmed", caplog, 0.5)
    assert warmed[0] == 0.0 and warmed[2] == 0.0  # Hugging Face's warm-up starts at 0
    caplog.clear()
    _, rates = _grpo_with_demonstrations(
        tiny_build, tmp_path / "grpo", caplog, 0.5, warmup_ratio=0.0
    )
    assert rates == pytest.approx([5e-4, 2.5e-4, 1e-4, 5e-5])


class FailingEnvironment(LengthEnvironment):
    """Every episode fails: no group has reward spread, so GRPO alone has no gradient."""

    def score(self):
        return 0.0


def _trained_parameters_after(tiny_build, tmp_path, replay_coefficient):
    """The LoRA weights before and after a GRPO step on all-fail stub tasks, with two
    world demonstrations as the replay, and the trainer's logged keys."""
    from coevolve.common.tokenization import load_tokenizer
    from coevolve.training.grpo.grpo_trainer import make_grpo_trainer
    from coevolve.training.trainers import common_arguments

    config = tiny_training(
        algorithm="grpo",
        max_steps=3,
        grpo={"demonstration_steps": 1, "replay_coefficient": replay_coefficient},
    )
    tasks = [
        Task(id=f"t{i}", env="stub", family="f", turns=[Turn(query=f"say {i}")]) for i in range(2)
    ]
    trainer, _, reason = make_grpo_trainer(
        config,
        model_dir=tiny_build,
        previous_adapter=None,
        tokenizer=load_tokenizer(tiny_build),
        tasks=tasks,
        make_env=FailingEnvironment,
        system_prompt=None,
        arguments={**common_arguments(config, "cpu", tmp_path, progress=False), "max_steps": 1},
        replay_conversations=demonstrations(load_split("train", size=2), WorldEnvironment),
    )
    assert reason is None
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    changed = sum(not after[name].detach().equal(value) for name, value in before.items())
    logged = {key for entry in trainer.state.log_history for key in entry}
    return changed, logged


def test_grpo_replay_coefficient_trains_where_groups_have_no_spread(tiny_build, tmp_path):
    """grpo.replay_coefficient (PPO-ptx): every GRPO step also takes the SFT loss of the
    demonstration steps' conversations. With every group all-fail GRPO's own loss has no
    gradient and the adapter stays as it was; with the term it moves, and replay/nll is
    logged."""
    unchanged, logged = _trained_parameters_after(tiny_build, tmp_path / "off", 0.0)
    assert unchanged == 0 and "replay/nll" not in logged
    changed, logged = _trained_parameters_after(tiny_build, tmp_path / "on", 1.0)
    assert changed > 0 and "replay/nll" in logged
    with pytest.raises(ValueError, match="replay_coefficient"):
        tiny_training(algorithm="grpo", grpo={"replay_coefficient": 0.5})


def test_grpo_replay_coefficient_reaches_the_grpo_steps_of_a_cycle(tiny_build, tmp_path, caplog):
    """Through train_adapter: the demonstration steps, then GRPO steps that log the replay
    term on the same conversations."""
    result, _ = _grpo_with_demonstrations(
        tiny_build, tmp_path / "grpo", caplog, replay_coefficient=0.5
    )
    assert result.steps == 4 and result.demonstration_steps == 2
    assert "replay/nll" in caplog.text


def test_grpo_environment_wraps_the_world(tasks):
    """TRL's view of the world: one documented method per tool; the reference solution scores 1."""
    from transformers.utils import get_json_schema

    env = WorldEnvironment()
    episode_class = environment_class(env.tools())
    schema = get_json_schema(episode_class.find_contact)
    assert schema["function"]["parameters"]["required"] == ["name"]
    task = next(t for t in tasks if t.reference_answer is None)
    episode = episode_class(WorldEnvironment())
    assert episode.reset(task=task.model_dump_json(), prompt=[]) is None
    completion = []
    for call in task.reference_calls:
        text = getattr(episode, call.name)(**call.arguments)
        assert not text.startswith("error"), text
        completion.append({"role": "tool", "name": call.name, "content": text})
    completion.append({"role": "assistant", "content": "Done."})
    assert environment_score([completion], [episode]) == [1.0]
    # a wrong argument is the environment's own error observation, not an exception
    episode.reset(task=task.model_dump_json())
    assert episode.find_contact(nme="x").startswith("error")
    assert environment_score([[{"role": "assistant", "content": "Done."}]], [episode]) == [0.0]


def test_adapter_marker_is_written_last(tiny_build, trajectories, tmp_path):
    """An unfinished adapter directory (no marker) is not complete."""
    output = tmp_path / "partial"
    output.mkdir()
    (output / "adapter_config.json").write_text(json.dumps({}))
    assert not is_adapter_complete(output)
    (output / ADAPTER_MARKER).write_text("{")
    assert not is_adapter_complete(output)


def test_lora_settings_forbid_extra():
    with pytest.raises(ValidationError):
        LoraAdapterConfig(rank=4)


def test_sft_micro_batches_make_the_same_update(tiny_build, trajectories, tmp_path):
    """training.sft.micro_batch_size bounds memory, not the step: one step of 4
    conversations two at a time moves the adapter as one step of 4 at once. On the CPU
    (float32): on a GPU the step runs in bf16, where the two sums of the same gradient
    differ in the last bits and Adam's first step (about lr times the gradient's sign)
    turns such a difference into a whole step for a weight whose gradient is near 0."""
    import torch

    conversations = successful_conversations(trajectories, max_per_task=2)
    trained = {}
    for micro in (None, 2):
        output = tmp_path / f"micro-{micro}"
        train_adapter(
            tiny_training(max_steps=1, batch_size=4, sft={"micro_batch_size": micro}, device="cpu"),
            model_dir=tiny_build,
            output_dir=output,
            conversations=conversations,
            progress=False,
        )
        trained[micro] = _lora_tensors(output)
    assert trained[None].keys() == trained[2].keys()
    for key, value in trained[None].items():
        assert torch.allclose(value, trained[2][key], atol=1e-6), key
    # LoRA's B starts at zero: the step moved it, so the comparison is of an update
    assert any("lora_B" in key and value.abs().sum() > 0 for key, value in trained[2].items())


def test_activation_checkpointing_makes_the_same_step(
    tiny_build, trajectories, tmp_path, monkeypatch
):
    """training.activation_checkpointing recomputes activations in the backward pass: the
    memory of a step, not its result (dropout masks are replayed as they were drawn)."""
    import torch
    from transformers import PreTrainedModel

    enabled = []
    enable = PreTrainedModel.activation_checkpointing_enable

    def recorded(self, *args, **kwargs):
        enabled.append(type(self).__name__)
        return enable(self, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "activation_checkpointing_enable", recorded)
    conversations = successful_conversations(trajectories, max_per_task=2)
    trained, losses = {}, {}
    for checkpointing in (False, True):
        output = tmp_path / f"checkpointing-{checkpointing}"
        result = train_adapter(
            tiny_training(
                max_steps=2, batch_size=4, activation_checkpointing=checkpointing, device="cpu"
            ),
            model_dir=tiny_build,
            output_dir=output,
            conversations=conversations,
            progress=False,
        )
        trained[checkpointing], losses[checkpointing] = _lora_tensors(output), result.final_loss
        assert bool(enabled) == checkpointing  # the trainer turned it on, and only when asked
    assert losses[True] == pytest.approx(losses[False], rel=1e-6)
    for key, value in trained[False].items():
        assert torch.allclose(value, trained[True][key], atol=1e-6), key
    assert any("lora_B" in key and value.abs().sum() > 0 for key, value in trained[True].items())
