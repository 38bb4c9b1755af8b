"""One rendering for rollouts and training, and token-exact trajectories.

- The prompt a policy reads (in-process, or what an endpoint's server renders from the
  request's messages and tools) is byte-identical to the start of the text training
  renders for the same conversation, with and without tools in the prompt.
- A rollout records the ids the model read and wrote; training uses those ids, so a
  reply whose ids differ from a re-tokenisation of its text is trained as generated.
"""

from __future__ import annotations

import pytest

from coevolve.agents.policy.conversation import opening_messages, reference_conversation
from coevolve.agents.policy.endpoint_policy import EndpointPolicy
from coevolve.agents.policy.local_policy import LocalPolicy
from coevolve.agents.policy.policy_interface import PolicyError
from coevolve.agents.policy.rendering import (
    encode,
    full_prompts,
    render_conversation,
    token_sequences,
    turn_from_ids,
)
from coevolve.agents.policy.rollout import run_rollouts
from coevolve.common.tokenization import load_tokenizer
from coevolve.config import CoevolveConfig, EndpointConfig
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.records import ModelTurn
from coevolve.testing.openai_server import calls_then_answer
from coevolve.testing.presets import tiny_training
from coevolve.training.chat_template import (
    PLAIN_CALLS_TEMPLATE,
    render,
    tokenize_for_training,
)
from coevolve.training.datasets import PreferencePair, TrainingConversation
from coevolve.training.tokenized_datasets import dpo_dataset, sft_dataset
from coevolve.training.trainers import train_adapter


def _world_tools(task, count=None):
    env = WorldEnvironment()
    env.reset(task)
    return env.tools()[:count]


def _assistant_indices(messages):
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


@pytest.mark.parametrize("template", ["qwen2_5", "plain_calls"])
@pytest.mark.parametrize("tools_in_prompt", [False, True])
def test_rendering_local_prompt_is_the_training_prompt(tiny_build, template, tools_in_prompt):
    policy = LocalPolicy(tiny_build, max_new_tokens=4, tools_in_prompt=tools_in_prompt)
    if template == "plain_calls":  # SmolLM2's format, the default agent's
        policy.tokenizer.chat_template = PLAIN_CALLS_TEMPLATE
    task = next(t for t in load_split("validation") if len(t.turns[0].reference_calls) >= 2)
    messages, _ = reference_conversation(WorldEnvironment(), task)
    tools = _world_tools(task, count=3)  # the tiny model reads 1024 positions; 31 schemas fill 5k
    trained = render(
        policy.tokenizer, messages, training=True, tools=tools if tools_in_prompt else None
    )
    if template == "plain_calls" and tools_in_prompt:
        with pytest.raises(PolicyError, match="does not render tool schemas"):
            policy._prompt_ids(messages[:3], tools)
        return
    names = [tool["function"]["name"] for tool in tools]
    assert (names[0] in trained.split(task.turns[0].query)[0]) == tools_in_prompt
    for index in _assistant_indices(messages):
        served_ids = policy._prompt_ids(messages[:index], tools)
        assert isinstance(served_ids, list)
        served = policy.tokenizer.decode(served_ids)
        assert trained.startswith(served), f"prompt of message {index} differs"
    # The training ids and mask come from the same rendering.
    row = tokenize_for_training(policy.tokenizer, messages, tools if tools_in_prompt else None)
    assert policy.tokenizer.decode(row["input_ids"]) == trained


def test_rendering_endpoint_prompt_is_the_training_prompt(tiny_build, scripted_server):
    """What a server with the served model's template renders from our requests (messages
    and tools) is the start of what training renders for the finished trajectory."""
    config = CoevolveConfig.model_validate(
        {
            "policy": {
                "kind": "endpoint",
                "endpoint": {"base_url": "http://127.0.0.1:1/v1", "model": "m"},
            }
        }
    )
    assert config.policy.renders_tools  # an endpoint's server renders the request's tools
    server = scripted_server(calls_then_answer(2, name="find_contact", arguments='{"name": "Ana"}'))
    policy = EndpointPolicy(
        EndpointConfig(base_url=server.base_url, model=server.model),
        tools_in_request=config.policy.renders_tools,
    )
    task = load_split("validation")[0]
    (trajectory,) = run_rollouts(policy, WorldEnvironment, [task], progress=False)
    tokenizer = load_tokenizer(tiny_build)
    tools = _world_tools(task)
    trained = render(tokenizer, trajectory.messages, training=True, tools=tools)
    bodies = server.chat_bodies()
    assert len(bodies) == 3
    for body in bodies:
        assert body["tools"] == tools
        served = render_conversation(
            tokenizer, body["messages"], body["tools"], add_generation_prompt=True
        )
        assert trained.startswith(served)


def _char_ids(tokenizer, text):
    """``text`` one character per token: a tokenisation the tokenizer itself never makes."""
    ids = [tokenizer.convert_tokens_to_ids(char) for char in text]
    assert tokenizer.unk_token_id not in ids and None not in ids
    return ids


def test_token_drift_training_uses_the_generated_ids(tiny_build):
    tokenizer = load_tokenizer(tiny_build)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    opening = opening_messages("What is Ana's number?")
    prompt = encode(tokenizer, render_conversation(tokenizer, opening, add_generation_prompt=True))
    generated = [*_char_ids(tokenizer, "Done now."), eos]
    # The drift: the same text, tokenised again, is not what the model generated.
    assert tokenizer.decode(generated[:-1]) == "Done now."
    assert encode(tokenizer, "Done now.") != generated[:-1]

    messages = [*opening, {"role": "assistant", "content": "Done now."}]
    turn = turn_from_ids(len(opening), prompt, generated, [-0.5] * len(generated), [])
    exact = sft_dataset(tokenizer, [TrainingConversation(messages=messages, model_turns=[turn])])
    assert exact["input_ids"][0] == prompt + generated
    assert exact["assistant_masks"][0] == [0] * len(prompt) + [1] * len(generated)
    retokenised = sft_dataset(tokenizer, [messages])
    assert retokenised["input_ids"][0] != exact["input_ids"][0]


def test_token_sequences_chain_turns_and_split_where_a_prompt_does_not_continue():
    first = turn_from_ids(2, [1, 2, 3], [10, 11], None, [])
    second = turn_from_ids(4, [1, 2, 3, 10, 11, 20], [12], None, [1, 2, 3, 10, 11])
    assert (second.prompt_shared, second.prompt_new_ids) == (5, [20])
    (one,) = token_sequences([first, second])
    assert one.input_ids == [1, 2, 3, 10, 11, 20, 12]
    assert one.assistant_masks == [0, 0, 0, 1, 1, 0, 1]
    # The reply rendered back differently (11 became 99): the next turn starts a sequence.
    third = turn_from_ids(6, [1, 2, 3, 10, 99, 20, 12, 30], [13], None, [1, 2, 3, 10, 11, 20, 12])
    assert full_prompts([first, second, third])[2] == [1, 2, 3, 10, 99, 20, 12, 30]
    sequences = token_sequences([first, second, third])
    assert [s.input_ids for s in sequences] == [
        [1, 2, 3, 10, 11, 20, 12],
        [1, 2, 3, 10, 99, 20, 12, 30, 13],
    ]
    assert sequences[1].assistant_masks == [0] * 8 + [1]
    with pytest.raises(ValueError, match="not from one trajectory"):
        full_prompts([ModelTurn(message_index=0, prompt_shared=3, completion_ids=[1])])


def test_token_exact_rollout_records_what_the_model_read_and_wrote(tiny_build):
    policy = LocalPolicy(tiny_build, max_new_tokens=24, temperature=0.0)
    tasks = load_split("validation")[:3]
    trajectories = run_rollouts(policy, WorldEnvironment, tasks, progress=False, max_tool_calls=3)
    checked = [t for t in trajectories if t.error is None]
    assert checked  # (the chaining of several turns: test_token_sequences_chain_turns...)
    for trajectory in checked:
        turns = trajectory.model_turns
        assert [t.message_index for t in turns] == _assistant_indices(trajectory.messages)
        for prompt, turn in zip(full_prompts(turns), turns, strict=True):
            # the ids the policy builds for that point of the conversation
            expected = policy._prompt_ids(trajectory.messages[: turn.message_index], None)
            assert prompt == expected
            assert turn.logprobs is not None and len(turn.logprobs) == len(turn.completion_ids)
            assert all(lp <= 0.0 for lp in turn.logprobs)
        generated = [i for t in turns for i in t.completion_ids]
        trained = [
            i
            for s in token_sequences(turns)
            for i, m in zip(s.input_ids, s.assistant_masks, strict=True)
            if m
        ]
        assert trained == generated  # every generated id trained once, as generated


def test_token_exact_dpo_trains_on_the_generated_ids(tiny_build, tmp_path):
    tokenizer = load_tokenizer(tiny_build)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    opening = opening_messages("What is Ana's number?")
    prompt = encode(tokenizer, render_conversation(tokenizer, opening, add_generation_prompt=True))
    chosen = [*_char_ids(tokenizer, "555"), eos]
    rejected = [*encode(tokenizer, "Done."), eos]
    pair = PreferencePair(
        task_id="t",
        prompt=opening,
        chosen=[{"role": "assistant", "content": "555"}],
        rejected=[{"role": "assistant", "content": "Done."}],
        chosen_turns=[turn_from_ids(2, prompt, chosen, None, [])],
        rejected_turns=[turn_from_ids(2, prompt, rejected, None, [])],
    )
    dataset = dpo_dataset(tokenizer, [pair])
    assert dataset[0] == {"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected}
    # A side without ids (an expert's reference) is rendered and encoded; the other keeps
    # its generated ids, which the re-tokenisation would not give back ("555" by character).
    expert = pair.model_copy(update={"chosen_turns": []})
    mixed = dpo_dataset(tokenizer, [pair, expert])
    rendered_555 = encode(
        tokenizer,
        render_conversation(tokenizer, [*opening, {"role": "assistant", "content": "555"}])[
            len(render_conversation(tokenizer, opening, add_generation_prompt=True)) :
        ].rstrip(),
    )
    assert rendered_555 != chosen
    assert mixed[0]["chosen_ids"] == chosen
    assert mixed[1] == {"prompt_ids": prompt, "chosen_ids": rendered_555, "rejected_ids": rejected}
    turned = pair.model_copy(update={"rejected_turns": []})
    assert dpo_dataset(tokenizer, [turned])[0]["chosen_ids"] == chosen
    result = train_adapter(
        tiny_training(algorithm="dpo"),
        model_dir=tiny_build,
        output_dir=tmp_path / "dpo",
        pairs=[pair],
        progress=False,
    )
    assert result.skipped is None and result.steps > 0


def test_rendering_a_prompt_longer_than_max_length_skips_the_step_and_says_why(
    tiny_build, tmp_path
):
    task = load_split("validation")[0]
    messages, _ = reference_conversation(WorldEnvironment(), task)
    result = train_adapter(
        tiny_training(max_length=64),
        model_dir=tiny_build,
        output_dir=tmp_path / "sft",
        conversations=[TrainingConversation(messages=messages, tools=_world_tools(task))],
        progress=False,
    )
    assert result.steps == 0 and "policy.tools_in_prompt: false" in (result.skipped or "")
