"""Co-Evolving Agents: graded failure ranking, the failure agent's adapter, the target's objective.

Real TRL trainers on the tiny bootstrap model (2 steps); nothing here depends on
what a model learns. Graded failures are made by replaying the first calls of a
task's reference solution in the real world environment and stopping, so their
failure grade is known without a model.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from coevolve.agents.policy.conversation import DONE_ANSWER, opening_messages, tool_call_message
from coevolve.agents.prompts import POLICY_SYSTEM_PROMPT
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.records import Step, Task, Trajectory
from coevolve.testing.presets import tiny_bootstrap, tiny_training
from coevolve.training.hard_negatives.agents import (
    AdapterSwitch,
    HardNegativeConfig,
    expert_conversations,
    failure_pairs,
    hard_negative_share,
    load_objective,
    target_objective,
    target_pairs,
    train_preference_adapter,
    with_failure_grades,
)

TINY = tiny_bootstrap()


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    """Train tasks whose reference takes at least two calls: partial replays grade between 0 and
    1, and stopping one call short is a hard negative (grade >= 0.5, the step's threshold)."""
    families: dict[str, Task] = {}
    for task in load_split("train"):
        if len(task.reference_calls) < 2 or task.family in families:
            continue
        episodes = with_failure_grades(
            [episode(task, calls, calls) for calls in range(len(task.reference_calls))],
            {task.id: task},
        )
        progress = [t.failure_grade for t in episodes]
        if progress[0] < progress[-1] < 1.0 and progress[-1] >= 0.5:
            families[task.family] = task
    assert len(families) >= 3
    return list(families.values())[:3]


def episode(task: Task, calls: int, index: int, answer: str | None = None) -> Trajectory:
    """The first ``calls`` reference calls of ``task``, then a final answer: a real, scored episode."""
    env = WorldEnvironment()
    messages = opening_messages(env.reset(task) or "", POLICY_SYSTEM_PROMPT)
    steps = []
    for number, call in enumerate(task.reference_calls[:calls]):
        observation = env.step(call)
        call_id = f"call_{number}"
        messages.append(
            {"role": "assistant", "content": "", "tool_calls": [tool_call_message(call, call_id)]}
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": observation.text})
        steps.append(Step(call=call, observation=observation))
    if answer is None:
        answer = task.reference_answer or DONE_ANSWER
    messages.append({"role": "assistant", "content": answer})
    env.end_turn(answer)
    return Trajectory(
        id=f"{task.id}/r{index}",
        task_id=task.id,
        env="world",
        family=task.family,
        messages=messages,
        steps=steps,
        final_answer=answer,
        score=env.score(),
    )


def graded(tasks: list[Task], offset: int = 0) -> list[Trajectory]:
    """Per task: a success, an episode of every partial length, and one that stops at once."""
    out = []
    for task in tasks:
        total = len(task.reference_calls)
        for calls in range(total + 1):
            out.append(episode(task, calls, offset + calls))
    return with_failure_grades(out, {task.id: task for task in tasks})


def failure_agent_episodes(tasks: list[Task]) -> list[Trajectory]:
    """The failure agent's failures: the same partial calls, its own wording of the answer."""
    episodes = [
        episode(task, calls, calls, answer="All set, done.")
        for task in tasks
        for calls in range(len(task.reference_calls))
    ]
    return retagged(with_failure_grades(episodes, {task.id: task for task in tasks}), "failure")


def retagged(trajectories: list[Trajectory], suffix: str) -> list[Trajectory]:
    return [t.model_copy(update={"id": f"{t.id}/{suffix}"}) for t in trajectories]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- configuration


def test_settings_are_off_by_default_and_documented():
    from coevolve.config import CoevolveConfig

    config = CoevolveConfig()
    assert config.hard_negatives.enabled is False
    for name, field in HardNegativeConfig.model_fields.items():
        assert field.description, f"{name} has no description"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"failure_agent": False}, "set failure_share: 0"),
        (
            {"failure_agent": False, "failure_share": 0, "freeze_failure_after": 1},
            "needs a failure agent",
        ),
        (
            {"failure_agent": False, "failure_share": 0, "failure_rollouts": 2},
            "failure_rollouts set",
        ),
        ({"hard_threshold": 1.0}, "less than 1"),
        ({"failure_share": 1.5}, "less than or equal to 1"),
        ({"sft_weigth": 1.0}, "Extra inputs"),
    ],
)
def test_settings_reject_bad_combinations(values, message):
    with pytest.raises(ValidationError, match=message):
        HardNegativeConfig.model_validate(values)


def test_own_negatives_settings_are_accepted():
    settings = HardNegativeConfig(enabled=True, failure_agent=False, failure_share=0.0)
    assert not settings.trains_failure_agent(1)
    frozen = HardNegativeConfig(freeze_failure_after=1)
    assert frozen.trains_failure_agent(1) and not frozen.trains_failure_agent(2)


# --------------------------------------------------------------------------- graded ranking


def test_failure_grade_grades_failures_between_zero_and_one(tasks):
    trajectories = graded(tasks)
    for task in tasks:
        mine = [t for t in trajectories if t.task_id == task.id]
        full = mine[-1]
        assert full.score == 1.0 and full.failure_grade == 1.0
        partial = [t.failure_grade for t in mine[:-1]]
        assert all(t.score < 1.0 for t in mine[:-1])
        assert partial == sorted(partial) and partial[0] < partial[-1] < 1.0
    # binary scores alone would tie every failure: the grade is what separates them
    assert len({t.failure_grade for t in trajectories if t.score < 1}) > 1
    assert len({t.score for t in trajectories if t.score < 1}) == 1


def test_failure_pairs_never_include_a_success_nor_a_tie(tasks):
    target = graded(tasks)
    failure = failure_agent_episodes(tasks)
    pairs = failure_pairs(target, failure, max_per_task=10, hard_threshold=0.5)
    assert pairs, "graded failures must make pairs"
    by_id = {t.id: t for t in target + failure}
    for pair in pairs:
        chosen, rejected = by_id[pair.chosen_id], by_id[pair.rejected_id]
        assert chosen.score < 1.0 and rejected.score < 1.0
        assert chosen.failure_grade > rejected.failure_grade  # strictly: ties dropped
        assert chosen.task_id == rejected.task_id == pair.task_id
        assert pair.hard == (chosen.failure_grade >= 0.5)
    # either agent's failure may be the chosen one
    assert {p.chosen_agent for p in pairs} == {"target", "failure"}
    # identical failures of the two agents are one failure: never paired with themselves
    assert all(by_id[p.chosen_id].messages != by_id[p.rejected_id].messages for p in pairs)


def test_failure_pairs_rank_the_nearest_miss_first_and_cap(tasks):
    target = graded(tasks)
    pairs = failure_pairs(target, [], max_per_task=1)
    assert len(pairs) == len(tasks)  # one per task
    for pair in pairs:
        best = max(t.failure_grade for t in target if t.task_id == pair.task_id and t.score < 1.0)
        assert pair.chosen_grade == best
    # all failures tied (binary only): nothing to learn, no pair
    tied = [t.model_copy(update={"failure_grade": 0.0}) for t in target if t.score < 1.0]
    assert failure_pairs(tied, [], max_per_task=4) == []
    # no failure grade: never ranked
    ungraded = [t.model_copy(update={"failure_grade": None}) for t in target]
    assert failure_pairs(ungraded, [], max_per_task=4) == []


def test_hard_negative_share_counts_failures_at_or_above_the_threshold(tasks):
    trajectories = graded(tasks)
    failures = [t for t in trajectories if t.score < 1.0]
    share = hard_negative_share(trajectories, 0.5)
    hard = sum(t.failure_grade >= 0.5 for t in failures)
    assert share["failures"] == len(failures) and share["hard"] == hard
    assert share["share"] == pytest.approx(hard / len(failures))
    assert share["success"] == pytest.approx(len(tasks) / len(trajectories))
    assert hard_negative_share([], 0.5)["share"] is None


def test_target_pairs_put_the_expert_first_and_mix_sources(tasks):
    target = graded(tasks)
    failure = failure_agent_episodes(tasks)
    experts = expert_conversations(tasks, WorldEnvironment, POLICY_SYSTEM_PROMPT)
    assert set(experts) == {task.id for task in tasks}
    for share, sources in ((0.0, {"target"}), (1.0, {"failure"}), (0.5, {"target", "failure"})):
        settings = HardNegativeConfig(failure_share=share, pairs_per_task=2)
        pairs = target_pairs(experts, target, failure, settings)
        assert {p.rejected_agent for p in pairs} == sources
        for pair in pairs:
            assert pair.chosen_agent == "expert"
            assert [*pair.prompt, *pair.chosen] == experts[pair.task_id]
            assert pair.rejected_score < 1.0
        assert max(sum(p.task_id == t.id for p in pairs) for t in tasks) <= 2
    # only failures from min_negative_progress on; the hardest first
    settings = HardNegativeConfig(failure_share=0.0, pairs_per_task=1, min_negative_progress=0.3)
    pairs = target_pairs(experts, target, [], settings)
    for pair in pairs:
        best = max(t.failure_grade for t in target if t.task_id == pair.task_id and t.score < 1.0)
        assert pair.rejected_grade == best >= 0.3


def test_target_pairs_cut_long_failures_to_the_expert_plus_turns(tasks):
    task = tasks[0]
    failure = episode(task, 1, 0, answer="not yet")
    long = failure.model_copy(
        update={
            "messages": failure.messages[:-1]
            + [{"role": "assistant", "content": "thinking"}, {"role": "user", "content": "go on"}]
            * 20
            + failure.messages[-1:]
        }
    )
    (long,) = with_failure_grades([long], {task.id: task})
    experts = expert_conversations([task], WorldEnvironment, POLICY_SYSTEM_PROMPT)
    settings = HardNegativeConfig(failure_share=0.0, truncate_extra_turns=1)
    (pair,) = target_pairs(experts, [long], [], settings)
    assert len(pair.rejected) == len(pair.chosen) + 2


def test_negatives_keep_their_generated_ids_unless_cut(tasks):
    """A negative trains on the ids the agent generated (its model turns); the expert is
    rendered; a negative cut to the expert's length has no whole id sequence left."""
    from coevolve.records import ModelTurn

    task = tasks[0]
    turns = [ModelTurn(message_index=2, prompt_new_ids=[1, 2], completion_ids=[3, 4])]
    failure = episode(task, 1, 0, answer="not yet")
    long = failure.model_copy(
        update={
            "messages": failure.messages[:-1]
            + [{"role": "assistant", "content": "thinking"}, {"role": "user", "content": "go on"}]
            * 20
            + failure.messages[-1:],
            "model_turns": turns,
        }
    )
    (long,) = with_failure_grades([long], {task.id: task})
    experts = expert_conversations([task], WorldEnvironment, POLICY_SYSTEM_PROMPT)
    whole = HardNegativeConfig(failure_share=0.0, truncate_extra_turns=None)
    (pair,) = target_pairs(experts, [long], [], whole)
    assert pair.rejected_turns == turns and pair.chosen_turns == []
    cut = HardNegativeConfig(failure_share=0.0, truncate_extra_turns=1)
    (pair,) = target_pairs(experts, [long], [], cut)
    assert len(pair.rejected) == len(pair.chosen) + 2 and pair.rejected_turns == []


# --------------------------------------------------------------------------- adapters


def random_adapter(model_dir: Path, out: Path, seed: int) -> Path:
    """A LoRA adapter with random (non-zero) weights on the tiny model: it changes the outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape) * 0.5)
    peft_model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def adapters(tiny_build, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return random_adapter(tiny_build, root / "target", 1), random_adapter(
        tiny_build, root / "failure", 2
    )


def logits(policy, ids):
    import torch

    with torch.inference_mode():
        return policy.model(input_ids=torch.tensor([ids])).logits[0, -1].clone()


@pytest.mark.parametrize("merge", [True, False])
def test_adapters_switch_without_reloading_the_base(tiny_build, adapters, monkeypatch, merge):
    import torch
    import transformers

    from coevolve.agents.policy.local_policy import LocalPolicy

    target, failure = adapters
    policy = LocalPolicy(tiny_build, adapter_path=target, merge_adapter=merge, max_new_tokens=4)
    ids = policy._encode("find_contact(name=")
    base_weight = policy.base_model.get_input_embeddings().weight
    base_values = base_weight.detach().clone()
    loads = []
    original = transformers.AutoModelForCausalLM.from_pretrained

    def counting(*args, **kwargs):
        loads.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", counting)

    as_target = logits(policy, ids)
    switch = AdapterSwitch(policy)
    with switch.serving(failure):
        as_failure = logits(policy, ids)
        assert policy.model.active_adapter == AdapterSwitch.NAME
        assert set(policy.model.peft_config) >= {AdapterSwitch.NAME, policy._adapter_name}
    assert not torch.allclose(as_target, as_failure, atol=1e-4)
    assert torch.allclose(logits(policy, ids), as_target, atol=1e-5)
    with switch.serving(None):  # a failure agent that is still the base model
        as_base = logits(policy, ids)
    assert not torch.allclose(as_base, as_target, atol=1e-4)
    assert torch.allclose(logits(policy, ids), as_target, atol=1e-5)
    assert loads == []  # the base model was never loaded again
    assert policy.base_model.get_input_embeddings().weight is base_weight
    assert torch.equal(base_weight, base_values)
    assert AdapterSwitch.NAME not in policy.model.peft_config

    # a target that is the base model itself: the failure adapter wraps it and goes again
    bare = LocalPolicy(tiny_build, merge_adapter=merge, max_new_tokens=4)
    loads.clear()  # its own one load
    before = logits(bare, ids)
    with AdapterSwitch(bare).serving(failure):
        assert torch.allclose(logits(bare, ids), as_failure, atol=1e-5)
    assert torch.allclose(logits(bare, ids), before, atol=1e-5)
    assert torch.allclose(before, as_base, atol=1e-5)
    assert loads == []


def test_adapter_switch_refuses_a_policy_without_a_local_base():
    with pytest.raises(Exception, match=r"policy\.kind: local"):
        AdapterSwitch(object())


# --------------------------------------------------------------------------- the target's objective


def _pairs(tasks):
    target = graded(tasks)
    experts = expert_conversations(tasks, WorldEnvironment, POLICY_SYSTEM_PROMPT)
    return target_pairs(experts, target, [], HardNegativeConfig(failure_share=0.0))


def _lora_tensors(adapter: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(adapter / "adapter_model.safetensors"))


def test_dpo_sft_objective_trains_and_changes_only_the_target_adapter(
    tiny_build, adapters, tasks, tmp_path
):
    import torch

    target, failure = adapters
    settings = HardNegativeConfig(sft_weight=0.5)
    objective = target_objective(settings)
    assert objective.loss_type == ["sigmoid", "sft"] and objective.loss_weights == [1.0, 0.5]
    base_files = {p.name: sha(p) for p in Path(tiny_build).glob("*.safetensors")}
    failure_files = {p.name: sha(p) for p in failure.iterdir() if p.is_file()}
    before = _lora_tensors(target)

    out = tmp_path / "cycle-1"
    result = train_preference_adapter(
        tiny_training(algorithm="dpo", max_steps=2, batch_size=2),
        objective,
        model_dir=tiny_build,
        output_dir=out,
        previous_adapter=target,
        pairs=_pairs(tasks),
        progress=False,
    )
    assert result.skipped is None and result.steps == 2 and result.final_loss is not None
    assert load_objective(out) == objective.model_copy(update={"beta": 0.1})  # dpo.beta
    after = _lora_tensors(out)
    assert before.keys() == after.keys()
    changed = [
        key for key, value in before.items() if key in after and not torch.equal(value, after[key])
    ]
    assert changed, "the target adapter did not move"
    # the base model and the failure agent's adapter are untouched
    assert {p.name: sha(p) for p in Path(tiny_build).glob("*.safetensors")} == base_files
    assert {p.name: sha(p) for p in failure.iterdir() if p.is_file()} == failure_files


def test_sft_weight_adds_a_per_token_nll_term(tiny_build, tasks, tmp_path):
    """One step's logged loss is linear in lambda: sigmoid + lambda * NLL, with NLL > 0."""
    pairs = _pairs(tasks)[:2]
    losses = {}
    for weight in (0.0, 1.0, 2.0):
        result = train_preference_adapter(
            tiny_training(algorithm="dpo", max_steps=1, batch_size=2),
            target_objective(HardNegativeConfig(sft_weight=weight)),
            model_dir=tiny_build,
            output_dir=tmp_path / f"w{weight}",
            previous_adapter=None,
            pairs=pairs,
            progress=False,
        )
        losses[weight] = result.final_loss
    nll = losses[1.0] - losses[0.0]
    assert nll > 0.5  # a per-token NLL of a tiny model is a few nats
    assert losses[2.0] - losses[0.0] == pytest.approx(2 * nll, rel=1e-3)


# --------------------------------------------------------------------------- the cycle step


def runtime(run_dir: Path, tiny_build: Path, tasks: list[Task], **hard):
    from coevolve.agents.policy.local_policy import LocalPolicy
    from coevolve.config import CoevolveConfig
    from coevolve.graph.cycle.graph import CycleRuntime
    from coevolve.memory.pool import TaskPool

    config = CoevolveConfig.model_validate(
        {
            "run_dir": str(run_dir),
            "rollout": {"k": 2, "max_tool_calls": 2},
            "training": {"max_steps": 2, "batch_size": 2, "lora": {"r": 4, "alpha": 8}},
            "hard_negatives": {"enabled": True, "hard_threshold": 0.5, **hard},
        }
    )
    return CycleRuntime(
        config=config,
        run_dir=run_dir,
        policy=LocalPolicy(tiny_build, max_new_tokens=8, batch_size=8),
        make_env=WorldEnvironment,
        pool=TaskPool(tasks, run_dir / "synthesized_tasks.jsonl"),
        history=None,
        patterns=None,
        store=None,
        roles=None,
        eval_tasks=[],
        model_dir=Path(tiny_build),
        progress=False,
    )


def test_cycle_step_trains_both_adapters_records_shares_and_resumes(tiny_build, tasks, tmp_path):
    from coevolve.graph.cycle.hard_negative_step import failure_adapter_dir, latest_failure_adapter
    from coevolve.records import PoolSample
    from coevolve.runner import train_cycle

    run_dir = tmp_path / "run"
    rt = runtime(run_dir, tiny_build, tasks)
    files = rt.files(1)
    # The cycle's rollouts, and the failure agent's (as a kill after its rollouts leaves them).
    target_episodes = [t for t in graded(tasks) if not t.steps or t.score == 1.0]
    failure_episodes = retagged([t for t in graded(tasks, 10) if t.score < 1.0], "failure")
    files.write_rollouts(target_episodes)
    files.write_failure_rollouts(failure_episodes)

    sample = PoolSample(accepted=[], replay=[])
    result = asyncio.run(train_cycle(rt, 1, None, target_episodes, [], sample))
    target_dir = run_dir / "adapters" / "cycle-1"
    failure_dir = failure_adapter_dir(run_dir, 1)
    assert result.adapter_dir == str(target_dir) and result.failure_adapter == str(failure_dir)
    assert result.failure is not None and result.failure.steps == 2 and result.steps == 2
    assert load_objective(failure_dir).loss_type == ["sigmoid"]
    assert load_objective(target_dir).loss_type == ["sigmoid", "sft"]
    assert rt.policy.adapter_path == target_dir  # the target serves; the failure agent does not
    figures = result.hard_negatives
    assert figures["failure_pairs"] > 0 and figures["failure_pairs_with_success"] == 0
    assert figures["target_pairs_by_source"]["failure"] > 0
    shares = {agent: figures[agent]["share"] for agent in ("target", "failure_agent")}
    # by construction: the target's failures stop early, the failure agent's include near misses
    assert shares["target"] == 0.0 and shares["failure_agent"] > 0.0
    assert files.hard_negative_figures() == figures

    # Killed after both adapters were saved, before the record: a fresh process resumes.
    stamps = {d: sha(d / "training.json") for d in (target_dir, failure_dir)}
    files.train_record.unlink()
    again = runtime(run_dir, tiny_build, tasks)
    resumed = asyncio.run(train_cycle(again, 1, None, target_episodes, [], sample))
    assert {d: sha(d / "training.json") for d in stamps} == stamps  # nothing retrained
    assert resumed.model_dump(exclude={"hard_negatives"}) == result.model_dump(
        exclude={"hard_negatives"}
    )
    assert again.policy.adapter_path == target_dir
    # the next cycle's failure agent continues this one's adapter, and serves from the same base
    assert latest_failure_adapter(run_dir, 2, None) == str(failure_dir)
    with AdapterSwitch(again.policy).serving(failure_dir):
        assert again.policy.model.active_adapter == AdapterSwitch.NAME
    assert again.policy.adapter_path == target_dir


def test_own_negatives_runs_without_a_failure_agent(tiny_build, tasks, tmp_path):
    from coevolve.records import PoolSample
    from coevolve.runner import train_cycle

    run_dir = tmp_path / "run"
    rt = runtime(run_dir, tiny_build, tasks, failure_agent=False, failure_share=0.0)
    episodes = graded(tasks)
    rt.files(1).write_rollouts(episodes)
    result = asyncio.run(train_cycle(rt, 1, None, episodes, [], PoolSample(accepted=[], replay=[])))
    assert result.failure is None and result.hard_negatives["failure_agent"] is None
    assert result.hard_negatives["target_pairs_by_source"] == {
        "target": result.hard_negatives["target_pairs"],
        "failure": 0,
    }
    assert not (run_dir / "adapters" / "failure-cycle-1").exists()


def test_a_run_with_hard_negatives_records_shares_per_cycle(tmp_path, tiny_build, monkeypatch):
    """The loop end to end on the tiny model (2 cycles): the failure agent's step sits in
    the train stage, its figures are in the cycle's summary, only the target is evaluated."""
    from coevolve.config import CoevolveConfig
    from coevolve.runner import run

    monkeypatch.setenv("COEVOLVE_CACHE", str(Path(tiny_build).parents[1]))
    config = CoevolveConfig.model_validate(
        {
            "run_dir": str(tmp_path / "run"),
            "cycles": 2,
            "rollout": {"k": 2, "max_tool_calls": 2},
            "policy": {"max_new_tokens": 16},
            "pool": {"rollout_tasks": 6, "replay_demonstrations": 2},
            "training": {"max_steps": 2, "batch_size": 2},
            "evaluation": {"per_family": 1},
            "hard_negatives": {"enabled": True, "failure_rollouts": 2},
        }
    ).model_copy(update={"bootstrap": TINY})
    result = run(config, progress=False)
    run_dir = Path(result.run_dir)
    for summary in result.cycles[1:]:
        assert summary.train is not None and summary.rollout is not None
        figures = summary.train.hard_negatives
        assert summary.train.failure is not None  # the failure agent's own step
        cycle_dir = run_dir / "cycles" / f"{summary.cycle:03d}"
        assert figures == json.loads((cycle_dir / "hard_negatives.json").read_text())
        assert figures["target"]["episodes"] == summary.rollout.episodes
        assert figures["failure_agent"]["episodes"] == 2 * summary.rollout.tasks
        assert figures["failure_pairs_with_success"] == 0
        assert figures["failure_time_s"] >= figures["failure_rollout_time_s"] > 0
        failure_episodes = (cycle_dir / "failure_rollouts.jsonl").read_text().splitlines()
        assert all(
            json.loads(line)["policy_version"].startswith("failure:") for line in failure_episodes
        )
        # evaluation ran with the target, never the failure agent
        evaluated = (cycle_dir / "eval.jsonl").read_text().splitlines()
        assert not any(
            json.loads(line)["policy_version"].startswith("failure:") for line in evaluated
        )
    print(
        "tiny-model hard-negative shares:",
        [
            (c.cycle, c.train.hard_negatives["target"], c.train.hard_negatives["failure_agent"])
            for c in result.cycles[1:]
            if c.train is not None
        ],
    )


def test_ablation_arms_switch_only_the_negatives():
    from coevolve.bench.learning import ARMS, arm_config
    from coevolve.config import load_config

    base = load_config("configs/bench-learning.yaml").model_dump(mode="json")
    arms = {
        arm: load_config(arm_config(base, arm, 1, Path("/tmp")))
        for arm in ("coevolve-oracle", "hard-negatives", "own-negatives")
    }
    assert not arms["coevolve-oracle"].hard_negatives.enabled
    assert (
        arms["hard-negatives"].hard_negatives.enabled
        and arms["hard-negatives"].hard_negatives.failure_agent
    )
    own = arms["own-negatives"].hard_negatives
    assert own.enabled and not own.failure_agent and own.failure_share == 0.0
    assert (
        set(ARMS["own-negatives"])
        == set(ARMS["hard-negatives"])
        == {
            "hard_negatives",
            "training",
        }
    )
    assert ARMS["own-negatives"]["training"] == ARMS["hard-negatives"]["training"]
    # the two arms differ in the negatives only: the same tuned target step
    with_failure_agent = arms["hard-negatives"].hard_negatives
    assert own.target_config(arms["own-negatives"].training) == with_failure_agent.target_config(
        arms["hard-negatives"].training
    )


def test_failure_agent_on_an_endpoint_is_a_second_adapter_beside_the_targets(
    scripted_server, tmp_path, caplog
):
    """vLLM serves both agents: the failure agent's adapter is hot-loaded under its own
    name for its rollouts and unloaded after, while the target's stays served."""
    import logging

    from coevolve.agents.policy.endpoint_policy import EndpointPolicy
    from coevolve.config import EndpointConfig
    from coevolve.testing.openai_server import Reply
    from coevolve.training.hard_negatives.agents import HardNegativeError, failure_agent_policy

    server = scripted_server([Reply.text("done")], repeat_last=True)
    model = server.model
    target = EndpointPolicy(EndpointConfig(base_url=server.base_url, model=model, max_retries=0))
    adapters = {}
    for name in ("cycle-1", "failure-cycle-1"):
        adapters[name] = tmp_path / name
        adapters[name].mkdir()
        (adapters[name] / "adapter_config.json").write_text("{}")
    conversation = [[{"role": "user", "content": "hi"}]]

    async def cycle() -> tuple[str, str]:
        await target.load_adapter(f"{model}-coevolve-cycle-1", str(adapters["cycle-1"]))
        async with failure_agent_policy(target, adapters["failure-cycle-1"]) as failure:
            await failure.generate(conversation, [[]])
            await target.generate(conversation, [[]])  # the target is served meanwhile
            served = failure.endpoint.model
        return served, target.endpoint.model

    failure_name = f"{model}-coevolve-failure-cycle-1"
    assert asyncio.run(cycle()) == (failure_name, f"{model}-coevolve-cycle-1")
    requests = [(r.path, r.body.get("lora_name") or r.body.get("model")) for r in server.requests]
    assert requests == [
        ("/v1/load_lora_adapter", f"{model}-coevolve-cycle-1"),
        ("/v1/load_lora_adapter", failure_name),
        ("/v1/chat/completions", failure_name),
        ("/v1/chat/completions", f"{model}-coevolve-cycle-1"),
        ("/v1/unload_lora_adapter", failure_name),
    ]

    # No failure adapter yet (cycle 1): the sibling rolls out the base model, loads nothing.
    async def base_cycle() -> str:
        async with failure_agent_policy(target, None) as failure:
            return failure.endpoint.model

    before = len(server.requests)
    assert asyncio.run(base_cycle()) == model
    assert server.requests[before:] == []

    # hot_load off cannot serve a second adapter; best_effort on a server without the
    # LoRA API rolls out the base model and says so.
    async def with_hot_load(mode: str) -> str:
        async with failure_agent_policy(target, adapters["failure-cycle-1"], mode) as failure:
            return failure.endpoint.model

    with pytest.raises(HardNegativeError, match="hot_load is off"):
        asyncio.run(with_hot_load("off"))
    server.refuse_adapters = (404, "Not Found")
    with caplog.at_level(logging.WARNING, logger="coevolve.training.hard_negatives.agents"):
        assert asyncio.run(with_hot_load("best_effort")) == model
    assert "rolls out the base model" in caplog.text
