"""LocalPolicy: batched generation, parsing, padding, truncation, adapters.

Uses the tiny bootstrap build (shared with test_bootstrap.py through the same
cache directory) and a randomly initialised copy of it whose outputs vary from
token to token, so padding mistakes would show. Nothing depends on learning.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from coevolve.agents.policy.conversation import opening_messages, reference_conversation
from coevolve.agents.policy.local_policy import LocalPolicy
from coevolve.agents.policy.policy_interface import AssistantMessage, Policy, PolicyError
from coevolve.common.tokenization import load_tokenizer
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.testing.presets import tiny_bootstrap
from coevolve.training.bootstrap.build import build_model

TINY = tiny_bootstrap()
MAX_NEW = 12


@pytest.fixture(scope="module")
def random_model(tiny_build, tmp_path_factory):
    """The tiny architecture with large random weights: every position's argmax differs."""
    import torch

    tokenizer = load_tokenizer(tiny_build)
    model = build_model(TINY, tokenizer)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    path = tmp_path_factory.mktemp("random-model")
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def policy(random_model):
    return LocalPolicy(random_model, max_new_tokens=MAX_NEW, batch_size=4)


def _conversations(count: int = 6):
    """Conversations of different lengths: openings and reference prefixes."""
    tasks = load_split("validation")[:count]
    conversations = []
    for index, task in enumerate(tasks):
        messages, _ = reference_conversation(WorldEnvironment(), task)
        # cut after a tool result (or after the user message): the model's turn
        cut = 2 + 2 * (index % 2)
        conversations.append(messages[: min(cut, len(messages) - 1)])
    return conversations


def _generate(policy, conversations, temperature=None):
    return asyncio.run(policy.generate(conversations, [[] for _ in conversations], temperature))


def test_local_policy_is_a_policy(policy):
    assert isinstance(policy, Policy)
    assert policy.version.startswith("random-model")
    assert policy.tokenizer.padding_side == "left"


def test_version_names_the_bootstrap_build(tiny_build):
    policy = LocalPolicy(tiny_build, max_new_tokens=4)
    assert policy.version == f"bootstrap-{TINY.cache_key()[:8]}"
    assert LocalPolicy(tiny_build, version="v7").version == "v7"


def test_batched_generation_gives_one_message_per_conversation(policy):
    conversations = _conversations(6)
    replies = _generate(policy, conversations)
    assert len(replies) == len(conversations)
    for reply, conversation in zip(replies, conversations, strict=True):
        assert isinstance(reply, AssistantMessage)
        assert reply.error is None
        assert reply.raw is not None
        assert reply.finish_reason in ("stop", "length")
        assert 1 <= reply.completion_tokens <= MAX_NEW
        expected_prompt = len(
            policy.tokenizer(policy._render(conversation, None), add_special_tokens=False)[
                "input_ids"
            ]
        )
        assert reply.prompt_tokens == expected_prompt  # no padding counted
    assert len({reply.raw for reply in replies}) > 1  # random weights: the texts differ


def test_batched_greedy_equals_unbatched_greedy(random_model, policy):
    conversations = _conversations(6)
    batched = _generate(policy, conversations, temperature=0.0)  # chunks of 4, padded
    single = LocalPolicy(random_model, max_new_tokens=MAX_NEW, batch_size=1)
    alone = [_generate(single, [conversation], 0.0)[0] for conversation in conversations]
    assert [r.raw for r in batched] == [r.raw for r in alone]
    assert [r.completion_tokens for r in batched] == [r.completion_tokens for r in alone]


def test_sampling_runs_and_differs_from_greedy(random_model):
    policy = LocalPolicy(random_model, max_new_tokens=MAX_NEW, seed=0)
    conversations = _conversations(4)
    greedy = _generate(policy, conversations, 0.0)
    sampled = _generate(policy, conversations, 1.5)
    assert len(sampled) == 4 and all(r.error is None for r in sampled)
    assert [r.raw for r in sampled] != [r.raw for r in greedy]


def test_generated_text_is_parsed_into_calls_and_answers(policy):
    tokenizer = policy.tokenizer
    eos = policy.eos_token_id

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    call = '<tool_call>\n{"name": "find_contact", "arguments": {"name": "Vito"}}\n</tool_call>'
    prompt = list(range(40))
    reply = policy._reply([*ids(call), eos, policy.pad_token_id, policy.pad_token_id], prompt, None)
    assert reply.raw == call  # the tags survive decoding
    assert reply.finish_reason == "stop"
    assert reply.completion_tokens == len(ids(call)) + 1
    assert reply.prompt_tokens == 40
    # the exact ids, padding after the end-of-turn token cut off
    assert reply.prompt_token_ids == prompt
    assert reply.completion_token_ids == [*ids(call), eos]
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("find_contact", {"name": "Vito"})]
    assert not reply.is_final

    answer = policy._reply([*ids("555-0192"), eos], list(range(10)), None)
    assert answer.is_final and answer.content == "555-0192"

    cut = policy._reply(ids('<tool_call>\n{"name": "find_con'), list(range(10)), None)
    assert cut.finish_reason == "length"
    assert cut.invalid_tool_calls and not cut.tool_calls
    assert cut.to_openai()["content"] == cut.raw  # unreadable text goes back verbatim

    # Special tokens other than the tags are dropped from the text.
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert policy._reply([start, *ids("Done."), eos], list(range(5)), None).content == "Done."


def test_over_long_prompts_are_shortened_or_refused(policy):
    limit = policy.max_positions - policy.max_new_tokens
    opening = opening_messages("Find Vito's number.")
    long_history = list(opening)
    for index in range(120):
        call = {
            "id": f"call_{index}",
            "type": "function",
            "function": {"name": "list_contacts", "arguments": "{}"},
        }
        long_history.append({"role": "assistant", "content": "", "tool_calls": [call]})
        long_history.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{index}",
                "content": "id=c1 name=Ana phone=555-0192",
            }
        )
    huge_request = opening_messages("Find " + "Vito " * 2000)
    replies = _generate(policy, [long_history, huge_request, opening])
    assert replies[0].error is None
    assert replies[0].prompt_tokens <= limit
    assert replies[1].error is not None and "too long" in replies[1].error
    assert replies[2].error is None


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(PolicyError, match="no model"):
        LocalPolicy(tmp_path / "nothing")


def _save_adapter(model_dir, path, seed):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir))
    config = LoraConfig(
        r=4,
        lora_alpha=64,
        target_modules=["q_proj", "v_proj", "down_proj"],
        init_lora_weights=False,
    )
    model = get_peft_model(base, config)
    model.save_pretrained(str(path))
    return path


def test_adapters_load_and_reload(random_model, tmp_path):
    conversations = _conversations(3)
    first = _save_adapter(random_model, tmp_path / "cycle-001", seed=1)
    second = _save_adapter(random_model, tmp_path / "cycle-002", seed=2)

    base = LocalPolicy(random_model, max_new_tokens=MAX_NEW)
    base_out = [r.raw for r in _generate(base, conversations)]

    with_first = LocalPolicy(random_model, adapter_path=first, max_new_tokens=MAX_NEW)
    assert with_first.version.endswith("+cycle-001")
    first_out = [r.raw for r in _generate(with_first, conversations)]
    assert first_out != base_out  # the adapter is applied

    with_first.reload_adapter(second)
    assert with_first.version.endswith("+cycle-002")
    reloaded = [r.raw for r in _generate(with_first, conversations)]
    fresh_second = LocalPolicy(random_model, adapter_path=second, max_new_tokens=MAX_NEW)
    assert reloaded == [r.raw for r in _generate(fresh_second, conversations)]
    assert reloaded != first_out

    with_first.reload_adapter(None)
    assert "+" not in with_first.version
    assert [r.raw for r in _generate(with_first, conversations)] == base_out

    with pytest.raises(PolicyError, match="no LoRA adapter"):
        with_first.reload_adapter(tmp_path / "missing")
    asyncio.run(with_first.aclose())


def test_rollouts_run_with_the_tiny_model(tiny_build):
    from coevolve.agents.policy.rollout import run_rollouts

    policy = LocalPolicy(tiny_build, max_new_tokens=8)
    tasks = load_split("validation")[:3]
    trajectories = run_rollouts(
        policy, WorldEnvironment, tasks, k=2, max_tool_calls=2, progress=False
    )
    assert len(trajectories) == 6
    assert {t.policy_version for t in trajectories} == {policy.version}
    assert all(0.0 <= t.score <= 1.0 for t in trajectories)
    json.dumps([t.model_dump() for t in trajectories])


def test_kv_reuse_generates_exactly_what_reencoding_generates(random_model):
    """Cached keys/values (holes in the mask, explicit positions) change no token."""
    reusing = LocalPolicy(random_model, max_new_tokens=MAX_NEW, batch_size=4, kv_reuse=True)
    encoding = LocalPolicy(random_model, max_new_tokens=MAX_NEW, batch_size=4, kv_reuse=False)
    tasks = load_split("validation")[:6]
    references = [reference_conversation(WorldEnvironment(), task)[0] for task in tasks]
    for cut in (2, 4, 6):
        conversations = [messages[: min(cut, len(messages) - 1)] for messages in references]
        with_cache = _generate(reusing, conversations)
        without = _generate(encoding, conversations)
        assert [r.raw for r in with_cache] == [r.raw for r in without]
        assert [r.prompt_tokens for r in with_cache] == [r.prompt_tokens for r in without]
    # Later calls found the earlier conversations' keys and values.
    assert reusing.prefix_cache.reused_tokens > 0
    assert len(reusing.prefix_cache) > 0


def test_kv_reuse_samples_like_reencoding_with_the_same_seed(random_model):
    reusing = LocalPolicy(random_model, max_new_tokens=MAX_NEW, batch_size=8, kv_reuse=True)
    conversations = _conversations()
    import torch

    torch.manual_seed(3)
    first = [r.raw for r in _generate(reusing, conversations, temperature=1.0)]
    reusing.prefix_cache.clear()
    torch.manual_seed(3)
    second = [r.raw for r in _generate(reusing, conversations, temperature=1.0)]
    assert first == second
    assert len(set(first)) > 1


def test_a_prompt_several_rows_share_is_encoded_once_and_changes_no_token(random_model):
    """K rollouts of one task, or a GRPO group, give several rows one prompt: its keys and
    values are computed once (kv_reuse's shared prefill), and greedy replies and their
    log-probs are what each prompt gets alone."""
    import torch
    from transformers import AutoModelForCausalLM

    from coevolve.agents.policy.kv_reuse import PrefixCache, generate_batch

    policy = LocalPolicy(random_model, max_new_tokens=MAX_NEW, batch_size=8)
    model = AutoModelForCausalLM.from_pretrained(random_model, dtype=torch.float32).eval()
    conversations = _conversations(2)
    first, second = [policy._prompt_ids(messages, None) for messages in conversations]
    prompts = [first, first, second, first, second, first]
    settings = {
        "max_new_tokens": MAX_NEW,
        "eos_token_id": policy.eos_token_id,
        "pad_token_id": policy.pad_token_id,
        "temperature": 0.0,
    }
    cache, scores = PrefixCache(), []
    together = generate_batch(model, prompts, cache, logprobs=scores, **settings)
    # Each shared prompt up to its last token once, then one token per row.
    assert cache.encoded_tokens == (len(first) - 1) + (len(second) - 1) + len(prompts)
    for ids, reply, reply_scores in zip(prompts, together, scores, strict=True):
        alone_scores: list[list[float]] = []
        alone = generate_batch(model, [ids], PrefixCache(), logprobs=alone_scores, **settings)
        assert reply == alone[0]
        assert reply_scores == pytest.approx(alone_scores[0], abs=1e-4)


def test_sampling_draws_each_token_with_its_probability_and_never_a_zero():
    """kv_reuse draws by inverting the cumulative distribution (one uniform number a
    row, not an exponential variate per vocabulary entry): the frequencies must follow
    the softmax, and a token of zero probability must never come out."""
    import math

    import torch

    from coevolve.agents.policy.kv_reuse import _pick

    probabilities = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    logits = torch.log(probabilities).expand(20_000, -1).clone()
    torch.manual_seed(0)
    counts = torch.bincount(_pick(logits, 1.0), minlength=6).double() / 20_000
    assert counts[[0, 2, 5]].sum() == 0
    # Within five binomial standard deviations of each probability.
    for token in (1, 3, 4):
        p = float(probabilities[token])
        assert abs(float(counts[token]) - p) < 5 * math.sqrt(p * (1 - p) / 20_000)
    # Temperature flattens: at 2.0 the odds of tokens 1 and 4 are sqrt(0.5 / 0.2).
    hot = torch.bincount(_pick(logits, 2.0), minlength=6).double()
    assert abs(float(hot[1] / hot[4]) - math.sqrt(2.5)) < 0.1


def test_the_growing_cache_holds_what_concatenation_holds():
    """kv_reuse's cache layers write each step into room they keep (no copy of the whole
    cache a step); across growth and a dropped row they hold exactly what the stock
    layer's concatenation holds."""
    import torch
    from transformers.cache_utils import DynamicLayer

    from coevolve.agents.policy.kv_reuse import _growing_layer_class

    torch.manual_seed(0)
    growing, stock = _growing_layer_class()(), DynamicLayer()
    steps = [torch.randn(3, 2, width, 4) for width in (5, 1, 1, 30, 1)]
    for index, keys in enumerate(steps):
        if index == 3:  # drop the middle row, as generate_batch drops finished ones
            for layer in (growing, stock):
                layer.batch_select_indices(torch.tensor([0, 2]))
        if index >= 3:
            keys = keys[[0, 2]]
        got = growing.update(keys, -keys)
        want = stock.update(keys, -keys)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert growing.keys.shape == (2, 2, 38, 4)


def test_max_live_episodes_comes_from_the_config_and_bounds_the_engine(tiny_build):
    from coevolve.agents.policy.rollout import run_rollouts
    from coevolve.config import load_config
    from coevolve.loop.build_runtime import build_policy

    config = load_config({"policy": {"max_new_tokens": 8, "max_live_episodes": 2}})
    policy = build_policy(config, model_dir=tiny_build)
    assert policy.max_live_episodes == 2
    seen = []
    generate = policy.generate

    async def counting(conversations, *args, **kwargs):
        seen.append(len(conversations))
        return await generate(conversations, *args, **kwargs)

    policy.generate = counting
    tasks = load_split("validation")[:3]
    trajectories = run_rollouts(
        policy, WorldEnvironment, tasks, k=2, max_tool_calls=2, progress=False
    )
    assert len(trajectories) == 6 and max(seen) == 2
    with pytest.raises(ValueError, match="max_live_episodes"):
        LocalPolicy(tiny_build, max_live_episodes=0)
