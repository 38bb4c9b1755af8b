"""A model named as TRL and transformers take it: a Hugging Face model id or a local directory.

``resolve_model`` turns either into a local directory (a Hub id through the Hugging Face
cache, as ``from_pretrained`` finds it; offline, a cached snapshot only), so the rest of
coevolve reads files from a path (training/bootstrap/base_models.py prepares the in-process base).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .config_base import ConfigError

# The files of a model for from_pretrained (weights, config, tokenizer, chat template).
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


class ModelNotFound(ConfigError):
    """A name that is neither a model directory nor a Hub model id reachable here (a
    ConfigError: the command says it in one line)."""


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def resolve_model(name: str | Path) -> Path:
    """The local directory of ``name``: a directory with a ``config.json`` as it is, a
    Hugging Face model id (``org/name``) as its snapshot in the Hub cache (downloaded
    when online, the cached one when ``HF_HUB_OFFLINE`` is set)."""
    text = str(name)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"{text}: a directory without config.json is no model directory")
        return path
    if isinstance(name, Path) or _looks_like_path(text) or path.exists():
        raise ModelNotFound(f"{text}: no model directory there")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        return Path(snapshot_download(text, allow_patterns=MODEL_FILES))
    except HFValidationError:
        raise ModelNotFound(
            f"{text!r} is neither a model directory nor a Hugging Face model id"
        ) from None
    except Exception as err:  # offline without a cached copy, an unknown or gated repo
        raise ModelNotFound(
            f"{text!r}: no model directory there and the Hugging Face Hub did not give it "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no detail'})"
        ) from None


def directory_fingerprint(path: Path) -> str:
    """A hash of a model directory's file names, sizes and modification times."""
    entries = sorted(
        (str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in path.rglob("*")
        if p.is_file()
    )
    return hashlib.sha256(json.dumps([str(path.resolve()), entries]).encode()).hexdigest()
