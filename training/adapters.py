"""LoRA adapters on disk and in memory: the ``TrainResult`` stored with each one, whether a
directory holds a finished adapter, loading the base model with a trainable adapter, and
saving an adapter atomically."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..records import TrainResult
from .config import TrainingConfig

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel

ADAPTER_MARKER = "training.json"


# --------------------------------------------------------------------------- adapters


def is_adapter_complete(path: str | Path) -> bool:
    """A finished adapter: ``training.json`` (written last) is there and readable."""
    try:
        json.loads((Path(path) / ADAPTER_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (Path(path) / "adapter_config.json").exists()


def load_train_result(path: str | Path) -> TrainResult:
    """The ``TrainResult`` stored with a finished adapter."""
    return TrainResult.model_validate(
        json.loads((Path(path) / ADAPTER_MARKER).read_text())["result"]
    )


def load_trainable_model(
    model_dir: str | Path, previous_adapter: str | Path | None = None
) -> PreTrainedModel:
    """The base model in float32, with the previous adapter loaded trainable when one is given.

    Without a previous adapter the plain model comes back and the trainer adds a
    new LoRA from ``peft_config``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if previous_adapter is None:
        return model
    if not (Path(previous_adapter) / "adapter_config.json").exists():
        raise FileNotFoundError(
            f"no LoRA adapter at {previous_adapter} (adapter_config.json missing); "
            "pass previous_adapter=None to start a new one"
        )
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(previous_adapter), is_trainable=True)  # type: ignore[return-value]


def save_adapter(
    model: Any,
    output_dir: Path,
    result: TrainResult,
    config: TrainingConfig,
    state_dict: dict[str, Any] | None = None,
) -> None:
    """Write the adapter beside ``output_dir``, marker last, then rename it into place.

    ``state_dict``: the full weights when the model is sharded (FSDP); None reads the model's.
    """
    from ..common.files import atomic_directory

    with atomic_directory(output_dir, hidden=True) as work:
        model.save_pretrained(str(work), state_dict=state_dict)
        metadata = {"result": result.model_dump(), "config": config.model_dump()}
        (work / ADAPTER_MARKER).write_text(json.dumps(metadata, indent=2) + "\n")


def model_and_peft(
    config: TrainingConfig, model_dir: str | Path, previous_adapter: str | Path | None
) -> tuple[Any, Any]:
    """(model, peft_config): a new LoRA through TRL, or the previous adapter already attached."""
    model = load_trainable_model(model_dir, previous_adapter)
    if previous_adapter is not None:
        return model, None
    return model, config.lora.to_peft(getattr(model.config, "num_hidden_layers", None))


@contextmanager
def merged_for_generation(model: Any) -> Iterator[None]:
    """The LoRA adapter merged into the base weights while a round's replies are sampled.

    Unmerged, every projection of every decoding step runs the base matmul plus
    the adapter's two small ones, dropout and a scaled add; merged, a step costs
    what the plain model's does. The gain is small: 8 episodes x 48 tokens on
    SmolLM2 with LoRA r 16 on every projection, one thread beside a bench unit,
    took 11.4-12.0 s unmerged and 9.2-12.6 s merged. (Two threads beside that
    unit took 91-127 s either way: oversubscribed cores, not the adapter.)
    Unmerging subtracts the same delta again, so the float32
    weights come back to within rounding (about 1e-7 relative per round); 16-bit
    weights would drift by more, so they are left unmerged, as is a model
    without an unmerged LoRA adapter.
    """
    import torch

    lora_layers = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "merged")]
    mergeable = (
        callable(getattr(model, "merge_adapter", None))
        and bool(lora_layers)
        and not any(layer.merged for layer in lora_layers)
        and next(model.parameters()).dtype == torch.float32
    )
    if not mergeable:
        yield
        return
    with torch.no_grad():
        model.merge_adapter()
    try:
        yield
    finally:
        with torch.no_grad():
            model.unmerge_adapter()
