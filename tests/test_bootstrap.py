"""The bootstrap model's recipe: tokenizer, chat template, label mask, cached builds, config.

Nothing here depends on what the model learns: the tiny preset trains a few
steps only.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys

import pytest
import yaml
from pydantic import ValidationError

from coevolve.agents.policy.conversation import reference_conversation
from coevolve.common.tokenization import load_tokenizer
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.testing.presets import load_preset, tiny_bootstrap
from coevolve.training.bootstrap.build import (
    METADATA_FILE,
    BootstrapConfig,
    bootstrap,
    bootstrap_dir,
    build_corpus,
    build_model,
    default_cache_dir,
    is_complete,
    load_metadata,
    make_trainer,
    parameter_count,
    train_tokenizer,
    training_dataset,
)
from coevolve.training.chat_template import (
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    TAG_TOKENS,
    render,
    tokenize_for_training,
    training_chat_template,
)

TINY = tiny_bootstrap()


@pytest.fixture(scope="module")
def corpus():
    return build_corpus(TINY)


@pytest.fixture(scope="module")
def tokenizer(tiny_build):
    return load_tokenizer(tiny_build)


def _multi_call_conversation():
    """A demonstration with several calls and tool results (buy_with_topup: 4+ calls)."""
    task = next(t for t in load_split("validation") if t.family == "buy_with_topup")
    messages, score = reference_conversation(WorldEnvironment(), task)
    assert score == 1.0
    return messages


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trips_world_text(tokenizer, corpus):
    texts = [render(tokenizer, messages) for messages in corpus[:10]]
    texts += [
        "id=c3 name=Ana phone=555-0192",
        'find_contact(name="Vito") saved id=p12 price=37 balance=104',
        "Text Zia 'see you at five' and move the dentist to 03-14 at 09:30.",
    ]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_special_and_tag_tokens_are_single_tokens(tokenizer):
    for token in (*SPECIAL_TOKENS, *TAG_TOKENS):
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, token
        assert tokenizer.convert_ids_to_tokens(ids[0]) == token
    assert tokenizer.eos_token == IM_END
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.padding_side == "left"
    # Tool-call tags are not special: they survive decoding that drops special tokens.
    ids = tokenizer(f'<tool_call>\n{{"name": "x"}}\n</tool_call>{IM_END}', add_special_tokens=False)
    decoded = tokenizer.decode(ids["input_ids"], skip_special_tokens=True)
    assert decoded == '<tool_call>\n{"name": "x"}\n</tool_call>'


def test_copied_values_tokenize_the_same_in_query_observation_and_call(tokenizer):
    """A value reads as the same tokens after a space and after a JSON quote."""
    for value in ("Vito", "kettle", "555-0192", "see you at five"):
        value_ids = tokenizer(value, add_special_tokens=False)["input_ids"]
        for context in (f"Call {value} now", f'{{"name": "{value}"}}', f"name={value} id=c1"):
            ids = tokenizer(context, add_special_tokens=False)["input_ids"]
            windows = [ids[i : i + len(value_ids)] for i in range(len(ids))]
            assert value_ids in windows, (value, context)


# --------------------------------------------------------------------------- chat template


def test_chat_template_renders_tool_calls_and_results(tokenizer):
    messages = _multi_call_conversation()
    text = render(tokenizer, messages)
    first_call = messages[2]["tool_calls"][0]["function"]
    arguments = json.loads(first_call["arguments"])
    expected_call = (
        f'<|im_start|>assistant\n<tool_call>\n{{"name": "{first_call["name"]}", '
        f'"arguments": {json.dumps(arguments)}}}\n</tool_call><|im_end|>\n'
    )
    assert expected_call in text
    assert f"<|im_start|>user\n<tool_response>\n{messages[3]['content']}\n</tool_response>" in text
    assert "# Tools" not in text  # no schemas in the prompt
    assert text.startswith(f"{IM_START}system\n{messages[0]['content']}{IM_END}\n")
    prompt = render(tokenizer, messages[:4], add_generation_prompt=True)
    assert prompt.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    # The training variant renders the same text (it only adds generation markers).
    assert render(tokenizer, messages, training=True) == text


def test_assistant_mask_covers_exactly_the_assistant_turns_with_end_of_turn(tokenizer):
    messages = _multi_call_conversation()
    encoded = tokenize_for_training(tokenizer, messages)
    ids, mask = encoded["input_ids"], encoded["assistant_masks"]
    assert len(ids) == len(mask)
    start_id = tokenizer.convert_tokens_to_ids(IM_START)
    end_id = tokenizer.convert_tokens_to_ids(IM_END)
    starts = [i for i, token in enumerate(ids) if token == start_id] + [len(ids)]
    roles = []
    newline = tokenizer.convert_tokens_to_ids("Ċ")
    for begin, stop in itertools.pairwise(starts):
        header = ids[begin:stop].index(newline)  # <|im_start|>role (a token or a few)
        role = tokenizer.decode(ids[begin + 1 : begin + header])
        roles.append(role)
        segment = mask[begin:stop]
        if role == "assistant":
            # <|im_start|>assistant is the prompt; everything after it, <|im_end|> included, is learned.
            assert not any(segment[:header])
            assert all(segment[header:]), tokenizer.decode(ids[begin:stop])
            assert end_id in [ids[i] for i in range(begin, stop) if mask[i]]
        else:
            assert not any(segment), (role, tokenizer.decode(ids[begin:stop]))
    assert roles.count("assistant") == sum(m["role"] == "assistant" for m in messages)
    assert roles.count("system") == 1
    # The masked text is exactly the assistant turns as the template writes them.
    learned = tokenizer.decode(
        [t for t, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False
    )
    expected = ""
    for message in messages:
        if message["role"] != "assistant":
            continue
        if message.get("tool_calls"):
            function = message["tool_calls"][0]["function"]
            arguments = json.dumps(json.loads(function["arguments"]))
            body = f'<tool_call>\n{{"name": "{function["name"]}", "arguments": {arguments}}}\n</tool_call>'
        else:
            body = message["content"]
        expected += f"\n{body}{IM_END}\n"
    assert learned == expected


def test_trl_sees_a_template_it_recognises_and_a_trained_stop_token(tokenizer):
    from trl.chat_template_utils import (
        add_response_schema,
        is_chat_template_prefix_preserving,
        is_chat_template_stop_token_trained,
        supports_tool_calling,
    )

    assert supports_tool_calling(tokenizer)
    assert is_chat_template_prefix_preserving(tokenizer)
    assert is_chat_template_stop_token_trained(tokenizer, chat_template=training_chat_template())
    add_response_schema(tokenizer)  # raises for a template TRL does not know


def test_sft_trainer_labels_follow_the_assistant_mask(tokenizer, corpus, tmp_path):
    dataset = training_dataset(tokenizer, corpus[:4])
    model = build_model(TINY, tokenizer)
    trainer = make_trainer(TINY, model, tokenizer, dataset, tmp_path / "trainer", progress=False)
    prepared = trainer.train_dataset
    assert len(prepared) == 4
    for index in range(4):
        expected = tokenize_for_training(tokenizer, corpus[index])
        labels = prepared[index]["labels"]
        assert prepared[index]["input_ids"] == expected["input_ids"]
        assert labels == [
            token if keep else -100
            for token, keep in zip(expected["input_ids"], expected["assistant_masks"], strict=True)
        ]
        assert labels[-2] == tokenizer.convert_tokens_to_ids(IM_END)  # the stop token is learned


# --------------------------------------------------------------------------- builds and the cache


def test_bootstrap_builds_a_loadable_model_with_metadata(tiny_build):
    from transformers import AutoModelForCausalLM

    assert tiny_build == bootstrap_dir(TINY, tiny_build.parent.parent)
    assert is_complete(tiny_build)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tiny_build / name).exists(), name
    metadata = load_metadata(tiny_build)
    assert BootstrapConfig(**metadata["config"]) == TINY
    assert metadata["cache_key"] == TINY.cache_key()
    assert metadata["steps"] == TINY.max_steps
    assert metadata["parameters"] > 0
    assert metadata["train_demonstrations"] == TINY.num_train_tasks
    assert metadata["train_examples"] == TINY.num_train_tasks * (1 + TINY.augment_copies)
    assert metadata["final_loss"] > 0
    assert metadata["eval"] is None
    model = AutoModelForCausalLM.from_pretrained(str(tiny_build))
    assert parameter_count(model) == metadata["parameters"]
    assert model.config.tie_word_embeddings
    assert model.config.eos_token_id == load_tokenizer(tiny_build).eos_token_id
    assert not list(tiny_build.parent.glob("*.partial-*"))  # no leftovers


def test_a_finished_build_is_reused_and_force_rebuilds(tiny_build, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(tiny_build.parent.parent, cache)
    path = bootstrap_dir(TINY, cache)
    sentinel = path / "sentinel"
    sentinel.write_text("still here")
    before = (path / METADATA_FILE).read_text()

    assert bootstrap(TINY, cache_dir=cache, progress=False) == path
    assert sentinel.exists()  # not rebuilt
    assert (path / METADATA_FILE).read_text() == before

    assert bootstrap(TINY, cache_dir=cache, force=True, progress=False) == path
    assert not sentinel.exists()  # rebuilt from scratch
    assert is_complete(path)


def test_an_unfinished_build_is_not_reused(tiny_build, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(tiny_build.parent.parent, cache)
    path = bootstrap_dir(TINY, cache)
    (path / METADATA_FILE).unlink()  # as if the build was killed before its last write
    (path / "sentinel").write_text("partial")
    assert not is_complete(path)
    stale = path.parent / f"{path.name}.partial-999999999"  # left by a killed process
    stale.mkdir()

    assert bootstrap(TINY, cache_dir=cache, progress=False) == path
    assert is_complete(path)
    assert not (path / "sentinel").exists()
    assert not stale.exists()


def test_cache_location_and_key(monkeypatch, tmp_path):
    monkeypatch.setenv("COEVOLVE_CACHE", str(tmp_path / "env-cache"))
    assert default_cache_dir() == tmp_path / "env-cache"
    assert bootstrap_dir(TINY).parent == tmp_path / "env-cache" / "bootstrap"
    monkeypatch.delenv("COEVOLVE_CACHE")
    assert default_cache_dir().name == "coevolve"
    # Everything that shapes the model is in the key; evaluation settings are not.
    assert tiny_bootstrap(max_steps=5).cache_key() != TINY.cache_key()
    assert tiny_bootstrap(seed=1).cache_key() != TINY.cache_key()
    assert tiny_bootstrap(eval_split="heldout").cache_key() == TINY.cache_key()
    assert BootstrapConfig().cache_key() == BootstrapConfig().cache_key()


def test_micro_batches_change_the_key_only_when_set():
    # The default build's key from before micro_batch_size existed (3eb1778): committed
    # caches and bench units keep theirs while the field is left at None.
    assert BootstrapConfig().cache_key() == "a655e0ae86a2ed1b"
    assert BootstrapConfig(micro_batch_size=2).cache_key() != BootstrapConfig().cache_key()


# --------------------------------------------------------------------------- config validation


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": 100, "num_heads": 3}, "must be divisible by num_heads"),
        ({"hidden_size": 96, "num_heads": 32}, "must be even for rotary"),
        ({"num_heads": 4, "num_kv_heads": 3}, "must be a multiple of num_kv_heads"),
        ({"max_length": 4096, "max_position_embeddings": 2048}, "lower max_length"),
        ({"train_split": "test"}, "allowed: train, validation, heldout"),
        ({"eval_split": "train"}, "measures memorisation"),
        ({"eval_split": "valid"}, "is not a world split"),
        ({"lr_scheduler": "cosine_with_restarts"}, "'cosine', 'linear' or 'constant'"),
        ({"vocab_size": 100}, "greater than or equal to 300"),
        ({"batch_sise": 8}, "batch_sise"),
        ({"max_steps": 0}, "greater than 0"),
    ],
)
def test_bad_configs_say_how_to_fix_them(overrides, message):
    with pytest.raises(ValidationError) as info:
        BootstrapConfig(**overrides)
    assert message in str(info.value)


def test_every_config_field_has_help_text():
    for name, field in BootstrapConfig.model_fields.items():
        assert field.description, name
    assert tiny_bootstrap().max_steps < BootstrapConfig().max_steps


def test_tokenizer_learns_no_merges_from_training_values(corpus):
    """With tokenizer_skip_values, a training-pool name is split like an unseen one."""
    from coevolve.envs.world import pools_for
    from coevolve.training.bootstrap.build import _template_texts

    texts = _template_texts(corpus)
    skipping = train_tokenizer(texts, TINY.model_copy(update={"vocab_size": 2000}))
    whole = train_tokenizer(
        texts, TINY.model_copy(update={"vocab_size": 2000, "tokenizer_skip_values": False})
    )
    names = [n for n in pools_for("train").names if any(n in t for t in texts) and len(n) > 2]
    assert names
    single_whole = sum(len(whole.tokenize(n)) == 1 for n in names)
    single_skipping = sum(len(skipping.tokenize(n)) == 1 for n in names)
    assert single_skipping < single_whole


def test_value_augmentation_replaces_pool_values_consistently(corpus):
    import re

    from coevolve.envs.world import pools_for
    from coevolve.training.bootstrap.build import ValueAugmenter, augment_corpus

    augmenter = ValueAugmenter("train", seed=0)
    train = pools_for("train")
    pool_values = {*train.names, *train.products, *train.titles, *train.messages}
    others = {
        value.lower()
        for split in ("validation", "heldout")
        for pools in [pools_for(split)]
        for value in (*pools.names, *pools.products, *pools.titles, *pools.messages)
    }
    for original in corpus:
        copy = augmenter(original)
        assert [m["role"] for m in copy] == [m["role"] for m in original]
        for old, new in zip(original, copy, strict=True):
            if old.get("tool_calls"):
                old_call, new_call = old["tool_calls"][0], new["tool_calls"][0]
                assert new_call["function"]["name"] == old_call["function"]["name"]
                old_args = json.loads(old_call["function"]["arguments"])
                new_args = json.loads(new_call["function"]["arguments"])
                assert new_args.keys() == old_args.keys()
                for key, value in new_args.items():
                    copied = key in ("name", "title", "query", "date", "time", "phone")
                    if copied and value != old_args[key]:
                        # a replaced value reads the same wherever the conversation uses it
                        assert value.lower() not in others
                        mentions = [m.get("content") or "" for m in copy]
                        assert any(value in text for text in mentions), (key, value)
        text = json.dumps(copy)
        for value in pool_values:
            assert not re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text), value
    config = TINY.model_copy(update={"augment_copies": 2})
    assert len(augment_corpus(corpus, config)) == 3 * len(corpus)
    assert augment_corpus(corpus, TINY.model_copy(update={"augment_copies": 0})) == corpus


def test_phrase_tokens_are_single_tokens_and_shorten_demonstrations(tokenizer, corpus):
    from coevolve.training.bootstrap.build import phrase_tokens

    assert TINY.phrase_tokens
    for phrase in phrase_tokens():
        ids = tokenizer(phrase, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, phrase
    text = render(tokenizer, corpus[0])
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert corpus[0][0]["content"] in tokenizer.convert_ids_to_tokens(ids)  # the system prompt
    plain = train_tokenizer(
        [render(tokenizer, messages) for messages in corpus],
        TINY.model_copy(update={"phrase_tokens": False}),
    )
    assert len(plain(text, add_special_tokens=False)["input_ids"]) > 1.5 * len(ids)


# --------------------------------------------------------------------------- the command


def _coevolve(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "coevolve", *args], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _tiny_config_with_default_evaluation(tmp_path) -> str:
    """The tiny preset with ``eval_split`` at the field's default (validation): the path a
    plain ``coevolve bootstrap`` takes, which the preset itself turns off."""
    section = load_preset("bootstrap-tiny")
    del section["eval_split"]
    section["eval_per_family"] = 1  # 18 tasks: the path matters here, not the figure
    path = tmp_path / "bootstrap.yaml"
    path.write_text(yaml.safe_dump({"bootstrap": section}))
    return str(path)


def test_bootstrap_command_evaluates_on_validation_by_default(tmp_path):
    config = _tiny_config_with_default_evaluation(tmp_path)
    assert BootstrapConfig.model_fields["eval_split"].default == "validation"
    out = _coevolve("bootstrap", "--config", config, "--cache-dir", str(tmp_path), "--json")
    metadata = json.loads(out.stdout.strip().splitlines()[-1])
    assert metadata["eval"]["split"] == "validation"
    assert metadata["eval"]["overall"]["episodes"] == 18
    assert 0.0 <= metadata["eval"]["overall"]["success_rate"] <= 1.0


def test_bootstrap_command_evaluates_a_cached_build_made_without_evaluation(tiny_build, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(tiny_build.parent.parent, cache)
    assert load_metadata(bootstrap_dir(TINY, cache))["eval"] is None  # built as the loop builds
    config = _tiny_config_with_default_evaluation(tmp_path)
    out = _coevolve("bootstrap", "--config", config, "--cache-dir", str(cache)).stdout
    assert "(cached)" in out and "validation success:" in out and "of 18 tasks" in out
    assert load_metadata(bootstrap_dir(TINY, cache))["eval"]["split"] == "validation"


def test_an_old_evaluation_key_is_refused_not_migrated():
    with pytest.raises(ValueError, match="eval_max_steps"):
        BootstrapConfig.model_validate({"base": "tiny", "eval_max_steps": 3})


def test_two_builds_of_one_key_started_together_build_once(tmp_path, monkeypatch):
    """Two commands on an empty cache: one builds, the other waits for it and reuses the
    build (before, the second to finish replaced the first's finished build)."""
    import threading

    from coevolve.training.bootstrap import build

    built = []
    real = build._build

    def counted(*args, **kwargs):
        built.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "_build", counted)
    config = BootstrapConfig.model_validate({**TINY.model_dump(), "eval_split": None})
    paths: list = []
    threads = [
        threading.Thread(
            target=lambda: paths.append(bootstrap(config, cache_dir=tmp_path, progress=False))
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert len(built) == 1 and len(paths) == 2 and paths[0] == paths[1]
    assert is_complete(paths[0]) and not list(paths[0].parent.glob("*.partial-*"))
