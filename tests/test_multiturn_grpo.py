"""Multi-turn GRPO (training/grpo/multiturn_rollout.py): a real TRL GRPOTrainer plays BFCL
multi-turn episodes through every user turn, on exactly the ids the model generated."""

from __future__ import annotations

import copy
import time

import pytest
import torch

from coevolve.common.config_base import merged
from coevolve.records import Task
from coevolve.testing.presets import tiny_training
from coevolve.training.config import TrainingConfig
from coevolve.training.grpo_config import GrpoConfig

BFCL_SYSTEM_PROMPT = "Use the tools."


def _bfcl_tasks():
    pytest.importorskip("bfcl_eval")
    from coevolve.envs.bfcl import load_tasks

    return [task for task in load_tasks("multi_turn_base", split="train") if len(task.turns) == 2]


def _abstention_task(task):
    """The entry with every turn an irrelevance turn (empty ground truth, as the turns that
    only bring held-out tools in multi_turn_miss_func): BFCL's checker accepts any episode
    that closes every turn, so even the tiny model's random replies get reward spread from
    the real verifier (episodes cut off by a budget score 0)."""
    turns = [turn.model_copy(update={"reference_calls": []}) for turn in task.turns]
    setup = {**task.setup, "ground_truth": [[] for _ in task.turns]}
    return task.model_copy(update={"id": f"{task.id}_abstain", "turns": turns, "setup": setup})


def _trainer(tiny_build, tmp_path, config, tasks):
    from coevolve.common.tokenization import load_tokenizer
    from coevolve.envs.bfcl import BfclEnvironment
    from coevolve.training.grpo.grpo_trainer import make_grpo_trainer
    from coevolve.training.trainers import common_arguments

    trainer, examples, reason = make_grpo_trainer(
        config,
        model_dir=tiny_build,
        previous_adapter=None,
        tokenizer=load_tokenizer(tiny_build),
        tasks=tasks,
        make_env=BfclEnvironment,
        system_prompt=BFCL_SYSTEM_PROMPT,
        arguments=common_arguments(config, "cpu", tmp_path, progress=False),
    )
    assert reason is None and examples == len(tasks)
    return trainer


def _runs(mask):
    """(start, end, value) of each run of equal values in a 0/1 mask."""
    runs, start = [], 0
    for index in range(1, len(mask) + 1):
        if index == len(mask) or mask[index] != mask[start]:
            runs.append((start, index, mask[start]))
            start = index
    return runs


# Room for two turns of the tiny model's random 96-token replies (its positions: 1024);
# one tool-calling reply ends an episode, so about half the abstention episodes
# fail and groups get reward spread (measured: 4-6 of 8 succeed per round).
MULTI_TURN = {
    "algorithm": "grpo",
    "max_steps": 1,
    "max_length": 1024,
    "batch_size": 12,
    "grpo": {
        "rollout": "multi_turn",
        "prompts_per_step": 3,
        "num_generations": 4,
        "max_completion_length": 800,
        "max_tool_calls": 1,
        "max_reply_tokens": 96,
    },
}


def test_multi_turn_grpo_step_plays_every_turn_on_generated_ids(tiny_build, tmp_path):
    bfcl = _bfcl_tasks()
    tasks = [bfcl[0], _abstention_task(bfcl[1]), _abstention_task(bfcl[2])]
    config = tiny_training(**MULTI_TURN)
    trainer = _trainer(tiny_build, tmp_path, config, tasks)
    assert type(trainer).__name__ == "MultiTurnGRPOTrainer"
    tokenizer = trainer.processing_class
    rows = {row["task"]: row for row in trainer.train_dataset}
    assert len(rows) == 3  # the multi-turn tasks are kept, not left out
    batch = [dict(row) for row in rows.values() for _ in range(config.grpo.num_generations)]

    # One generation round through TRL, before any update, inspected token by token.
    trainer.model.train()
    output = trainer._generate_and_score_completions(batch)
    episodes = trainer.rollout_func.last_episodes
    assert len(episodes) == len(batch)
    completion_ids, tool_mask = output["completion_ids"], output["tool_mask"]
    loss_mask = output["completion_mask"] * tool_mask  # what TRL's loss weighs
    several_turns = [e for e in episodes if e.user_turns > 1]
    assert several_turns, "no episode reached a second user turn"
    for episode in several_turns:
        # The second user turn reached the model: its query is in the environment's tokens.
        env_text = tokenizer.decode(
            [t for t, m in zip(episode.completion_ids, episode.env_mask, strict=True) if not m]
        )
        assert episode.task.turns[1].query[:40] in env_text
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model = trainer.model
    model.eval()
    for row, episode in enumerate(episodes):
        length = len(episode.completion_ids)
        assert completion_ids[row, :length].tolist() == episode.completion_ids
        assert tool_mask[row, :length].tolist() == episode.env_mask
        assert loss_mask[row].sum().item() == sum(map(len, episode.replies))
        prompt = output["prompt_ids"][row][output["prompt_mask"][row].bool()].tolist()
        assert prompt == episode.prompt_ids
        # Generated ids (mask 1) are the replies verbatim, in order, each followed by
        # environment ids (mask 0) only when the episode went on.
        runs = _runs(episode.env_mask)
        generated = [episode.completion_ids[a:b] for a, b, value in runs if value == 1]
        assert generated == episode.replies
        assert [value for _, _, value in runs] == [1, 0] * (len(episode.replies) - 1) + [1]
        # A reply cut at grpo.max_reply_tokens is closed by an end-of-turn token the
        # model did not write: environment side, out of the loss.
        assert all(len(reply) <= config.grpo.max_reply_tokens for reply in episode.replies)
        environment_runs = [episode.completion_ids[a:b] for a, b, value in runs if value == 0]
        for reply, following in zip(episode.replies, environment_runs, strict=False):
            assert (following[0] == end_of_turn) == (reply[-1] != end_of_turn)
        # ... and exactly what the model sampled in that context: the log-probability
        # the model gives each id over prompt + completion equals the one it had when
        # sampling it (kv_reuse's record, after temperature, as TRL scales its own).
        ids = torch.tensor([episode.prompt_ids + episode.completion_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float() / config.grpo.temperature
        scores = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        start = len(episode.prompt_ids)
        positions = [start + i - 1 for i, m in enumerate(episode.env_mask) if m]
        recorded = [score for reply in episode.logprobs for score in reply]
        assert scores[positions].tolist() == pytest.approx(recorded, abs=1e-4)
        # The record SEAL diagnoses: BFCL labels one per ground-truth user turn.
        trajectory = episode.trajectory
        assert len(trajectory.model_turns) == len(episode.replies)
        assert len(episode.diagnosis()) == len(episode.task.turns)
    # The reward TRL used is the verifier's score of each episode (0 unless every turn closed).
    rewards = list(trainer._logs["rewards"]["verifier_score"])[-len(episodes) :]
    assert rewards == [episode.score for episode in episodes]
    assert all(e.finished for e, reward in zip(episodes, rewards, strict=True) if reward > 0)

    # One optimisation step: the adapter changes where a group has reward spread.
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    logged = trainer.state.log_history[0]
    assert logged["frac_reward_zero_std"] < 1.0, "no group had reward spread"
    assert logged["multi_turn/user_turns"] > 1.0
    changed = [
        n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])
    ]
    assert changed and all("lora_" in n for n in changed)
    print(f"\nmulti-turn BFCL GRPO step on the tiny model: {seconds:.2f} s ({len(batch)} episodes)")


def test_multi_turn_grpo_seal_reweights_diagnosed_episodes(tiny_build, tmp_path):
    from coevolve.training.seal import CapabilityState, trajectory_weight

    bfcl = _bfcl_tasks()
    config = tiny_training(
        **merged(MULTI_TURN, {"batch_size": 8, "grpo": {"prompts_per_step": 2}}),
        seal={"reweight": {"enable": True, "dynamic": {"enable": True}}},
    )
    trainer = _trainer(tiny_build, tmp_path, config, [bfcl[0], _abstention_task(bfcl[1])])
    assert type(trainer).__name__ == "SealGRPOTrainer"
    assert isinstance(trainer.capability_state, CapabilityState)
    trainer.model.train()
    batch = [dict(row) for row in trainer.train_dataset for _ in range(config.grpo.num_generations)]
    output = trainer._generate_and_score_completions(batch)
    episodes = trainer.rollout_func.last_episodes
    labels = trainer.last_seal_labels
    assert labels == [episode.diagnosis() for episode in episodes]
    assert [len(episode_labels) for episode_labels in labels] == [2] * len(episodes)
    assert trainer.last_seal_weights == [
        trajectory_weight(episode_labels, config.seal.reweight, trainer.capability_state)
        for episode_labels in labels
    ]
    raw = list(trainer._logs["advantages"])[-len(episodes) :]
    expected = [a * w for a, w in zip(raw, trainer.last_seal_weights, strict=True)]
    assert output["advantages"].tolist() == pytest.approx(expected, abs=1e-6)


def test_multi_turn_is_auto_for_several_turns_or_calls_trl_cannot_parse(tiny_build):
    from coevolve.common.tokenization import load_tokenizer
    from coevolve.envs.world import load_split
    from coevolve.training.chat_template import PLAIN_CALLS_TEMPLATE
    from coevolve.training.grpo.grpo_trainer import choose_rollout

    tokenizer = load_tokenizer(tiny_build)  # TRL's Qwen2.5 template: TRL parses its calls
    world = load_split("train")[:2]
    bfcl = _bfcl_tasks()[:1]
    auto = TrainingConfig(algorithm="grpo")
    assert auto.grpo.rollout == "auto"
    assert choose_rollout(auto, world, tokenizer) == "tool_loop"
    assert choose_rollout(auto, world + bfcl, tokenizer) == "multi_turn"
    plain = copy.copy(tokenizer)
    plain.chat_template = PLAIN_CALLS_TEMPLATE  # SmolLM2's: no parser in TRL
    assert choose_rollout(auto, world, plain) == "multi_turn"
    assert getattr(plain, "response_template", None) is None  # asking changed nothing
    forced = TrainingConfig(algorithm="grpo", grpo={"rollout": "tool_loop"})
    assert choose_rollout(forced, bfcl, tokenizer) == "tool_loop"


def test_multi_turn_tool_loop_leaves_out_multi_turn_tasks_and_says_how_to_fix(tiny_build, tmp_path):
    from coevolve.common.tokenization import load_tokenizer
    from coevolve.envs.bfcl import BfclEnvironment
    from coevolve.training.grpo.grpo_trainer import make_grpo_trainer
    from coevolve.training.trainers import common_arguments

    config = tiny_training(algorithm="grpo", grpo={"rollout": "tool_loop"})
    trainer, examples, reason = make_grpo_trainer(
        config,
        model_dir=tiny_build,
        previous_adapter=None,
        tokenizer=load_tokenizer(tiny_build),
        tasks=_bfcl_tasks()[:2],
        make_env=BfclEnvironment,
        system_prompt=BFCL_SYSTEM_PROMPT,
        arguments=common_arguments(config, "cpu", tmp_path, progress=False),
    )
    assert trainer is None and examples == 0
    assert reason is not None and "grpo.rollout: multi_turn" in reason


def test_multi_turn_delta_refuses_a_template_that_rewrites_the_past(tiny_build):
    from coevolve.common.tokenization import load_tokenizer
    from coevolve.training.grpo.generated_replies import TemplateNotPrefixPreserving, rendered_delta

    tokenizer = load_tokenizer(tiny_build)
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    delta = rendered_delta(
        tokenizer, history, [{"role": "user", "content": "more"}], None, "<|im_end|>"
    )
    text = tokenizer.decode(delta)
    assert text.startswith("\n<|im_start|>user\nmore<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")
    # A template that shows only the last message: earlier text changes as turns follow.
    tokenizer.chat_template = (
        "{{ messages[-1]['content'] }}<|im_end|>"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateNotPrefixPreserving, match=r"grpo\.rollout: tool_loop"):
        rendered_delta(
            tokenizer, history, [{"role": "user", "content": "more"}], None, "<|im_end|>"
        )


def test_multi_turn_config_field_is_documented_and_checked():
    field = GrpoConfig.model_fields["rollout"]
    assert field.description and "multi_turn" in field.description
    with pytest.raises(ValueError, match="'auto', 'tool_loop' or 'multi_turn'"):
        TrainingConfig.model_validate({"grpo": {"rollout": "multiturn"}})
    # The flat key of earlier releases is refused, not migrated: the package has no shims.
    with pytest.raises(ValueError, match="grpo_rollout"):
        TrainingConfig.model_validate({"grpo_rollout": "multi_turn"})


class _ColocatedEngine:
    """Stands in for TRL's VLLMGeneration (colocate mode) in one unit test: vLLM needs CUDA.
    It samples with the tiny model and answers in VLLMGeneration.generate's shapes,
    recording the per-call settings the rollout gave it."""

    def __init__(self, model, eot, mode="colocate"):
        self.model, self.eot, self.mode = model, eot, mode
        self.tensor_parallel_size = 1
        self.max_completion_length = 800
        self.generation_kwargs = {"seed": 1}
        self.calls = []

    def generate(self, prompts, images, num_generations):
        from coevolve.agents.policy.kv_reuse import PrefixCache, generate_batch

        assert images is None and num_generations == 1
        self.calls.append((len(prompts), self.max_completion_length, dict(self.generation_kwargs)))
        logprobs = []
        with torch.no_grad():
            replies = generate_batch(
                self.model,
                prompts,
                PrefixCache(),
                max_new_tokens=self.max_completion_length,
                eos_token_id=self.generation_kwargs["stop_token_ids"][0],
                pad_token_id=self.eot,
                temperature=1.0,
                logprobs=logprobs,
            )
        # vLLM: per token a list of log-probs, the sampled token's first.
        return prompts, replies, [[[score] for score in row] for row in logprobs], None


def test_multi_turn_on_colocated_vllm_caps_each_reply_and_aligns_logprobs(tiny_build, tmp_path):
    from collections import defaultdict
    from types import SimpleNamespace

    bfcl = _bfcl_tasks()
    tasks = [_abstention_task(bfcl[1]), _abstention_task(bfcl[2])]
    config = tiny_training(**MULTI_TURN)
    trainer = _trainer(tiny_build, tmp_path, config, tasks)
    tokenizer = trainer.processing_class
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows = [dict(row) for row in trainer.train_dataset][:2]
    engine = _ColocatedEngine(trainer.model, eot)
    on_vllm = SimpleNamespace(
        use_vllm=True,
        vllm_generation=engine,
        processing_class=tokenizer,
        model=trainer.model,
        batch_rows=rows,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    output = trainer.rollout_func([row["prompt"] for row in rows], on_vllm)
    episodes = trainer.rollout_func.last_episodes
    # One engine call per round of replies, each capped at one reply, stopping at <|im_end|>;
    # the engine's own settings are back afterwards.
    assert len(engine.calls) == max(len(e.replies) for e in episodes)
    assert all(cap <= config.grpo.max_reply_tokens for _, cap, _ in engine.calls)
    assert all(kwargs == {"seed": 1, "stop_token_ids": [eot]} for _, _, kwargs in engine.calls)
    assert (engine.max_completion_length, engine.generation_kwargs) == (800, {"seed": 1})
    # vLLM's sampling log-probs line up with the completion: each generated id has its
    # own, environment ids 0.0 (masked out of TRL's importance-sampling correction).
    for episode, logprobs in zip(episodes, output["logprobs"], strict=True):
        assert len(logprobs) == len(episode.completion_ids)
        generated = [lp for lp, m in zip(logprobs, episode.env_mask, strict=True) if m]
        assert generated == [score for reply in episode.logprobs for score in reply]
        assert all(lp == 0.0 for lp, m in zip(logprobs, episode.env_mask, strict=True) if not m)
        assert all(lp < 0.0 for lp in generated)
    # A vLLM server cannot serve episodes of different lengths from several processes.
    engine.mode = "server"
    with pytest.raises(ValueError, match="only colocated"):
        trainer.rollout_func([row["prompt"] for row in rows], on_vllm)


def test_grpo_vllm_settings_are_checked():
    from coevolve.training.grpo.grpo_trainer import vllm_arguments

    with pytest.raises(ValueError, match="vLLM generates GRPO episodes only"):
        TrainingConfig(algorithm="sft", grpo={"vllm": "colocate"})
    with pytest.raises(ValueError, match="needs a GPU"):
        TrainingConfig(algorithm="grpo", grpo={"vllm": "colocate"}, device="cpu")
    with pytest.raises(ValueError, match=r"grpo\.vllm_server_url"):
        TrainingConfig(algorithm="grpo", grpo={"vllm": "server"})
    with pytest.raises(ValueError, match="only colocated"):
        TrainingConfig(
            algorithm="grpo",
            grpo={
                "vllm": "server",
                "vllm_server_url": "http://127.0.0.1:8000",
                "rollout": "multi_turn",
            },
        )
    assert vllm_arguments(TrainingConfig(algorithm="grpo")) == {}
    colocated = TrainingConfig(algorithm="grpo", grpo={"vllm": "colocate"}, max_length=4096)
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"coevolve\[vllm\]"):
            vllm_arguments(colocated)
    else:
        assert vllm_arguments(colocated) == {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.3,
            "vllm_max_model_length": 4096,
        }


def test_dynamic_sampling_refills_groups_without_spread(tiny_build, tmp_path):
    """A group whose episodes all fail (the tiny model never solves a real BFCL task) is
    dropped and refilled with a group of another task; the trained round keeps the
    prompts count and TRL's tensors line up (training/grpo/dynamic_sampling.py)."""
    bfcl = _bfcl_tasks()
    tasks = [bfcl[0]] + [_abstention_task(task) for task in bfcl[1:6]]
    settings = merged(MULTI_TURN, {"grpo": {"dynamic_sampling": True, "max_refills": 2}})
    config = tiny_training(**settings)
    trainer = _trainer(tiny_build, tmp_path, config, tasks)
    assert type(trainer).__name__ == "DynamicSamplingTrainer"
    size = config.grpo.num_generations
    rows = {row["task"]: row for row in trainer.train_dataset}
    hopeless = next(key for key in rows if "_abstain" not in key)
    others = [key for key in rows if key != hopeless][:2]
    batch = [dict(rows[key]) for key in [hopeless, *others] for _ in range(size)]

    trainer.model.train()
    output = trainer._generate_and_score_completions(batch)
    assert output["completion_ids"].shape[0] == len(batch) == output["advantages"].shape[0]
    assert output["prompt_ids"].shape[0] == len(batch) == output["tool_mask"].shape[0]
    assert output["num_items_in_batch"] == output["completion_mask"].sum()
    metrics = {key: values[-1] for key, values in trainer._metrics["train"].items() if values}
    assert metrics["dynamic/dropped"] >= 1  # at least the hopeless task's group
    assert metrics["dynamic/refilled"] >= metrics["dynamic/dropped"] - 0.5
    groups = output["advantages"].view(-1, size)
    with_gradient = sum(bool(group.abs().sum() > 0) for group in groups)
    assert with_gradient == round(metrics["dynamic/final_with_spread"] * len(groups))
    assert metrics["dynamic/final_with_spread"] > metrics["dynamic/groups_with_spread"] or (
        metrics["dynamic/groups_with_spread"] == 1.0
    )


def test_groups_with_spread_and_merging_rounds():
    from coevolve.training.grpo.dynamic_sampling import (
        groups_with_spread,
        merge_generation_outputs,
        select_rows,
    )

    assert groups_with_spread([True, False, True, True, False, False], 2) == [True, False, False]
    first = {
        "prompt_ids": torch.tensor([[5, 6], [5, 6]]),
        "prompt_mask": torch.ones(2, 2, dtype=torch.long),
        "completion_ids": torch.tensor([[1, 2, 3], [4, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
        "advantages": torch.tensor([0.5, -0.5]),
        "num_items_in_batch": torch.tensor(4),
    }
    second = {
        "prompt_ids": torch.tensor([[7, 8, 9], [7, 8, 9]]),
        "prompt_mask": torch.ones(2, 3, dtype=torch.long),
        "completion_ids": torch.tensor([[1], [2]]),
        "completion_mask": torch.tensor([[1], [1]]),
        "advantages": torch.tensor([0.0, 0.0]),
        "num_items_in_batch": torch.tensor(2),
    }
    merged = merge_generation_outputs([first, second], pad_id=0)
    assert merged["prompt_ids"].tolist() == [[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9]]
    assert merged["prompt_mask"].tolist()[0] == [0, 1, 1]  # prompts padded on the left
    assert merged["completion_ids"].tolist()[2] == [1, 0, 0]  # completions on the right
    assert int(merged["num_items_in_batch"]) == 6
    picked = select_rows(merged, [2, 3, 0, 1])
    assert picked["advantages"].tolist() == [0.0, 0.0, 0.5, -0.5]
    assert int(picked["num_items_in_batch"]) == 6
    assert int(select_rows(merged, [1])["num_items_in_batch"]) == 1


def test_grpo_tasks_by_spread_keep_where_a_group_would_have_spread():
    from coevolve.envs.world import load_split
    from coevolve.graph.cycle.training_step import tasks_by_spread
    from coevolve.records import Trajectory

    loaded = load_split("train", size=6)
    families = ["failing", "failing", "mixed", "mixed", "solved", "unseen"]
    tasks = [t.model_copy(update={"family": f}) for t, f in zip(loaded, families, strict=True)]

    def ran(task, score, index):
        return Trajectory(
            id=f"{task.id}-{index}", task_id=task.id, env="world", family=task.family, score=score
        )

    trajectories = [ran(tasks[0], 0.0, 0), ran(tasks[0], 0.0, 1)]  # all fail
    trajectories += [ran(tasks[2], 1.0, 0), ran(tasks[2], 0.5, 1)]  # spread (0.5 is a failure)
    trajectories += [ran(tasks[4], 1.0, 0), ran(tasks[4], 1.0, 1)]  # all succeed
    # tasks[1] and tasks[3] are new (synthesized this cycle): a variant of the failing family
    # and one of the mixed family; tasks[5]'s family had no rollouts (the cycle's rate, 1/2).
    chosen = tasks_by_spread(tasks, trajectories, minimum=2, group_size=8)
    assert {t.id for t in chosen} == {tasks[2].id, tasks[3].id, tasks[5].id}
    filled = tasks_by_spread(tasks, trajectories, minimum=5, group_size=8)
    assert {t.id for t in filled[3:]} <= {tasks[0].id, tasks[1].id, tasks[4].id}
    assert len(filled) == 5


def test_grpo_demonstration_steps_train_on_all_fail_tasks_and_what_is_replayed():
    """The demonstration steps' data: reference solutions of the tasks whose rollouts all
    failed (real world demonstrations, verified), then the cycle's successes with
    grpo.replay_successes and the pool's replayed demonstrations with grpo.replay_pool,
    neither of which can be on without demonstration steps."""
    from coevolve.envs.world import WorldEnvironment, load_split
    from coevolve.graph.cycle.training_step import demonstration_data
    from coevolve.records import Trajectory
    from coevolve.training.datasets import TrainingConversation, demonstrations_by_task
    from coevolve.training.grpo_config import GrpoConfig

    failing, mixed, solved, new = load_split("train", size=4)

    def ran(task, score, index):
        return Trajectory(
            id=f"{task.id}-{index}", task_id=task.id, env="world", family=task.family, score=score
        )

    trajectories = [ran(failing, 0.0, 0), ran(failing, 0.0, 1), ran(mixed, 1.0, 0)]
    trajectories += [ran(mixed, 0.0, 1), ran(solved, 1.0, 0), ran(solved, 1.0, 1)]
    succeeded = [TrainingConversation(messages=[{"role": "user", "content": "solved"}])]
    pool_replay = [TrainingConversation(messages=[{"role": "user", "content": "replayed"}])]
    demonstrated: list[str] = []

    def demonstrate(tasks):
        demonstrated.extend(task.id for task in tasks)
        return [
            TrainingConversation(messages=messages)
            for _, messages in demonstrations_by_task(tasks, WorldEnvironment)
        ]

    def data(**grpo):
        config = GrpoConfig(demonstration_steps=4, **grpo)
        return demonstration_data(
            config, [failing, mixed, solved, new], trajectories, succeeded, pool_replay, demonstrate
        )

    only_failed = data()
    assert demonstrated == [failing.id] and len(only_failed) == 1
    assert only_failed[0].messages[1]["content"] == failing.turns[0].query
    assert only_failed[0].messages[-1]["role"] == "assistant"
    assert data(replay_successes=True) == [*only_failed, *succeeded]
    assert data(replay_pool=True) == [*only_failed, *pool_replay]
    assert data(replay_successes=True, replay_pool=True) == [
        *only_failed,
        *succeeded,
        *pool_replay,
    ]
    for setting in ("replay_successes", "replay_pool"):
        with pytest.raises(ValueError, match=rf"{setting} trains in .* set it \(e.g. 4\)"):
            TrainingConfig(algorithm="grpo", grpo={setting: True})
        assert getattr(
            TrainingConfig(algorithm="grpo", grpo={setting: True, "demonstration_steps": 4}).grpo,
            setting,
        )


def test_the_spread_chance_of_a_group():
    from coevolve.envs.world import load_split
    from coevolve.training.grpo.dynamic_sampling import spread_chance, success_rates

    assert spread_chance(0.0, 8) == 0.0 and spread_chance(1.0, 8) == 0.0
    assert spread_chance(0.5, 2) == 0.5
    assert spread_chance(0.25, 8) > 0.89 > spread_chance(0.05, 8)

    a, b, c = (t.model_copy(update={"family": "f"}) for t in load_split("train", size=3))
    outcomes = {a.id: [True, False, False, False], b.id: [False, False]}
    rates = success_rates([a, b, c], outcomes, {a.id: "f", b.id: "f"})
    # family f: 1 of 6; a: (1 + 2/6) / 6, b: (0 + 2/6) / 4, c (no rollouts): the family's
    assert rates[a.id] == (1 + 2 / 6) / 6 and rates[b.id] == (2 / 6) / 4
    assert abs(rates[c.id] - 1 / 6) < 1e-12


def test_generation_round_runs_on_the_merged_adapter_and_unmerges_after(tiny_build):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from coevolve.training.adapters import merged_for_generation

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_build, dtype=torch.float32)
    # init_lora_weights=False: B is not zero, so merging changes the weights for real.
    model = get_peft_model(
        base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    model.eval()
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    layers = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "merged")]
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.no_grad():
        unmerged_logits = model(ids).logits
    with merged_for_generation(model):
        assert layers and all(layer.merged for layer in layers)
        with torch.no_grad():
            merged_logits = model(ids).logits
    assert not any(layer.merged for layer in layers)
    torch.testing.assert_close(merged_logits, unmerged_logits, atol=1e-4, rtol=1e-4)
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter, before[name], atol=1e-6, rtol=1e-6)

    # A plain model, or one already merged, is left as it is.
    plain = torch.nn.Linear(2, 2)
    with merged_for_generation(plain):
        pass
    model.merge_adapter()
    with merged_for_generation(model):
        assert all(layer.merged for layer in layers)
    assert all(layer.merged for layer in layers)


def test_a_group_whose_episodes_all_failed_gets_the_reference_episode(tiny_build, tmp_path):
    """The tiny model never solves a real BFCL task: its group gets the task's reference
    episode in place of its last one, played, parsed and verified like a generated one,
    so the group has reward spread (training/grpo/reference_episodes.py)."""
    bfcl = _bfcl_tasks()
    hopeless = bfcl[1]  # one call per user turn: its reference fits max_tool_calls 2
    assert [len(turn.reference_calls) for turn in hopeless.turns] == [1, 1]
    tasks = [hopeless, _abstention_task(bfcl[2]), _abstention_task(bfcl[3])]
    settings = merged(MULTI_TURN, {"grpo": {"reference_episodes": True, "max_tool_calls": 2}})
    config = tiny_training(**settings)
    trainer = _trainer(tiny_build, tmp_path, config, tasks)
    # grpo.micro_batch_size: 2 episodes per forward pass, still batch_size (12) a step.
    assert trainer.args.per_device_train_batch_size == 2
    assert trainer.args.gradient_accumulation_steps == 6
    size = config.grpo.num_generations
    rows = {Task.model_validate_json(row["task"]).id: row for row in trainer.train_dataset}
    batch = [dict(rows[task.id]) for task in tasks for _ in range(size)]

    trainer.model.train()
    output = trainer._generate_and_score_completions(batch)
    episodes = trainer.rollout_func.last_episodes
    group = episodes[:size]
    assert not any(episode.score for episode in group[:-1])  # the model's own: all failed
    reference = group[-1]
    assert reference.score == 1.0 and reference.finished and reference.user_turns == 2
    end_of_turn = trainer.processing_class.convert_tokens_to_ids("<|im_end|>")
    assert len(reference.replies) == 4  # a call and an answer in each user turn
    assert all(reply[-1] == end_of_turn for reply in reference.replies)
    calls = [step.call.name for step in reference.trajectory.steps]
    assert calls == [turn.reference_calls[0].name for turn in hopeless.turns]
    # TRL trains on it as on any episode: its replies are the loss tokens, its reward 1,
    # and the group now has gradient.
    row = size - 1
    loss_mask = (output["completion_mask"] * output["tool_mask"])[row]
    assert loss_mask.sum().item() == sum(map(len, reference.replies))
    rewards = list(trainer._logs["rewards"]["verifier_score"])[-len(episodes) :]
    assert rewards == [episode.score for episode in episodes]
    assert output["advantages"].view(-1, size)[0].abs().sum() > 0
    metrics = {key: values[-1] for key, values in trainer._metrics["train"].items() if values}
    assert metrics["reference/replaced"] >= 1 / len(tasks)
    assert metrics["reference/all_fail_groups"] >= metrics["reference/replaced"]


def test_old_policy_log_probs_come_from_the_rollout_and_match_trls_pass(tiny_build, tmp_path):
    """A round of 12 episodes feeds 3 optimisation steps of 4, so TRL needs the old
    policy's log-probs: the sampled episodes bring their own, equal to TRL's no-grad pass;
    the reference episode (scripted replies) is the only row that pass computes."""
    from trl import GRPOTrainer

    bfcl = _bfcl_tasks()
    tasks = [bfcl[1], _abstention_task(bfcl[2]), _abstention_task(bfcl[3])]
    settings = merged(
        MULTI_TURN, {"batch_size": 4, "grpo": {"reference_episodes": True, "max_tool_calls": 2}}
    )
    config = tiny_training(**settings)
    trainer = _trainer(tiny_build, tmp_path, config, tasks)
    assert trainer.args.steps_per_generation > trainer.args.gradient_accumulation_steps
    size = config.grpo.num_generations
    rows = {Task.model_validate_json(row["task"]).id: row for row in trainer.train_dataset}
    batch = [dict(rows[task.id]) for task in tasks for _ in range(size)]

    computed_rows = []
    own_pass = GRPOTrainer._get_per_token_logps_and_entropies
    forward_pass = type(trainer)._unpadded_logps

    def counting(self, model, input_ids, *args, **kwargs):
        if not torch.is_grad_enabled():
            computed_rows.append(input_ids.size(0))
        return forward_pass(self, model, input_ids, *args, **kwargs)

    trainer.model.train()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(trainer), "_unpadded_logps", counting)
        output = trainer._generate_and_score_completions(batch)
    episodes = trainer.rollout_func.last_episodes
    scripted = [row for row, e in enumerate(episodes) if e.old_policy_logprobs() is None]
    assert scripted == [size - 1]  # the hopeless task's group got its reference episode
    assert computed_rows == [1]  # TRL's pass ran for that row alone
    old = output["old_per_token_logps"]

    # TRL's own pass over the whole round, on the weights that sampled it (no dropout).
    trainer.model.eval()
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    with torch.no_grad():
        expected, _, _ = own_pass(trainer, trainer.model, ids, mask, old.size(1), batch_size=4)
    loss_mask = (output["completion_mask"] * output["tool_mask"]).bool()
    torch.testing.assert_close(old[loss_mask], expected[loss_mask], atol=2e-4, rtol=0)
    # The trainer's own pass skips the columns a chunk of rows does not attend to, and
    # gives what TRL's pass over the padded width gives.
    with torch.no_grad():
        unpadded, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, old.size(1), batch_size=2
        )
    assert unpadded.shape == expected.shape
    torch.testing.assert_close(unpadded[loss_mask], expected[loss_mask], atol=2e-4, rtol=0)
    metrics = trainer._metrics["train"]["old_logps/from_rollout"]
    assert metrics[-1] == pytest.approx(1 - 1 / len(episodes))

    # One optimisation step on them trains the adapter.
    trainer.model.train()
    trainer.train()
    assert trainer.state.global_step == config.max_steps


def test_trimmed_columns_keep_what_some_row_attends_and_the_completion():
    from coevolve.training.grpo.multiturn_trainer import trimmed_columns

    # Rows of width 8, completion in the last 3 columns: left padding in columns 0-1,
    # right padding in column 7.
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 0, 0]])
    assert trimmed_columns(mask, 3) == (2, 7)
    # Never into the completion from the left, and one completion column at least.
    assert trimmed_columns(torch.tensor([[0, 0, 0, 0, 1, 0]]), 2) == (4, 5)
    assert trimmed_columns(torch.tensor([[1, 1, 0, 0, 0, 0]]), 3) == (0, 4)
    assert trimmed_columns(torch.zeros((2, 5), dtype=torch.long), 2) == (0, 5)


def test_reference_episodes_need_the_multi_turn_rollout_and_own_generation():
    with pytest.raises(ValueError, match=r"grpo\.rollout: multi_turn or auto"):
        GrpoConfig(reference_episodes=True, rollout="tool_loop")
    with pytest.raises(ValueError, match=r"grpo\.vllm: off"):
        GrpoConfig(reference_episodes=True, vllm="colocate")
    assert GrpoConfig(reference_episodes=True).rollout == "auto"


def test_micro_batches_keep_the_examples_per_step():
    from coevolve.training.trainer_common import micro_batches

    config = tiny_training(batch_size=12, gradient_accumulation_steps=2)
    assert micro_batches(config, 2) == {
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 12,
    }
    assert micro_batches(config, 5)["per_device_train_batch_size"] == 4  # a divisor of 12
    assert micro_batches(config, None) == {
        "per_device_train_batch_size": 12,
        "gradient_accumulation_steps": 2,
    }


def test_multi_turn_grpo_with_a_kl_term_trains(tiny_build, tmp_path):
    """grpo.beta > 0 (a tuned knob): the multi-turn trainer scores the episodes under the
    reference (the adapter disabled) and the step's loss carries the KL term."""
    bfcl = _bfcl_tasks()
    tasks = [_abstention_task(task) for task in bfcl[:3]]
    config = tiny_training(**merged(MULTI_TURN, {"grpo": {"beta": 0.04}}))
    trainer = _trainer(tiny_build, tmp_path, config, tasks)
    trainer.train()
    logged = {key for entry in trainer.state.log_history for key in entry}
    assert "kl" in logged, sorted(logged)


def test_max_tool_calls_is_the_bound():
    from coevolve.training.grpo.multiturn_rollout import MultiTurnRollout

    def make(**bound):
        return MultiTurnRollout(
            lambda: None, tools_in_prompt=False, max_completion_tokens=16, **bound
        )

    assert make(max_tool_calls=3).max_tool_calls == 3
    with pytest.raises(TypeError, match="max_tool_calls"):
        make()
    with pytest.raises(ValueError, match="max_tool_calls must be >= 1"):
        make(max_tool_calls=0)


def test_an_episode_ends_unfinished_where_the_token_budget_runs_out(tiny_build):
    """The two ends a completion budget puts to an episode in the rollout engine: a reply cut
    inside it keeps its ids and is not acted on; a closed reply whose next user turn does
    not fit ends the episode there, without environment ids after it."""
    from coevolve.agents.policy.conversation import opening_messages
    from coevolve.agents.policy.rendering import encode
    from coevolve.common.tokenization import load_tokenizer
    from coevolve.envs.bfcl import BfclEnvironment
    from coevolve.training.grpo.multiturn_rollout import MultiTurnRollout

    task = _bfcl_tasks()[0]
    tokenizer = load_tokenizer(tiny_build)
    answer = encode(tokenizer, "Done.<|im_end|>")
    assert answer[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    opening = opening_messages(BfclEnvironment().reset(task), BFCL_SYSTEM_PROMPT)

    def scripted(prompts, cap):
        return [answer[:cap] for _ in prompts], [[-0.5] * len(answer[:cap]) for _ in prompts]

    def play(max_completion_tokens):
        rollout = MultiTurnRollout(
            BfclEnvironment,
            tools_in_prompt=False,
            max_tool_calls=4,
            max_completion_tokens=max_completion_tokens,
        )
        (episode,) = rollout.play(scripted, tokenizer, [task], [opening])
        return episode

    cut = play(max_completion_tokens=2)
    assert cut.replies == [answer[:2]] and cut.completion_ids == answer[:2]
    assert cut.env_mask == [1, 1] and cut.old_policy_logprobs() == [-0.5, -0.5]
    assert not cut.finished and cut.trajectory.error == "token budget spent inside a reply"
    assert not cut.trajectory.steps and cut.trajectory.final_answer is None

    # The answer closes the first turn; the second user query does not fit after it.
    spent = play(max_completion_tokens=len(answer) + 2)
    assert spent.replies == [answer] and spent.completion_ids == answer
    assert spent.env_mask == [1] * len(answer) and spent.user_turns == 1
    assert not spent.finished and spent.trajectory.error == "token budget spent"
    assert spent.trajectory.final_answer == "Done." and spent.score == 0.0
    assert spent.trajectory.messages[-1]["content"] == task.turns[1].query

    # With room, the same replies close every turn, each next query as environment ids.
    whole = play(max_completion_tokens=2000)
    assert whole.finished and whole.user_turns == len(task.turns)
    assert whole.replies == [answer] * len(task.turns)
