"""Vectors of a long list of texts, kept on disk for the next run that embeds the same list.

Every run embeds its seed pool into its task store: 6.3 s of one core for the world's 1000
tasks with MiniLM, again for every run, bench unit and test that starts from the same pool.
A call with ``SAVED_MIN_TEXTS`` texts or more keeps its vectors under
``$COEVOLVE_CACHE/embeddings``; a synthesis pass's few candidates are not worth a file.

The key holds everything a vector depends on: the weights (their folder, and the size and
time of each file in it), the encoding and the batching that decides each pass's padding,
the thread count (it orders the sums) and the texts in order, so a saved vector is the one
encoding would give, bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..common.files import default_cache_dir

SAVED_MIN_TEXTS = 50
SAVED_FILES_KEPT = 64


def saved_vectors_path(model: Path, settings: list[Any], texts: list[str]) -> Path:
    """The file of ``texts`` embedded by the weights in ``model`` with ``settings``."""
    stats = {f.name: f.stat() for f in model.iterdir()}
    files = sorted((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats.items())
    digest = hashlib.sha256(json.dumps([str(model), files, settings]).encode())
    for text in texts:
        digest.update(text.encode(errors="surrogatepass"))
        digest.update(b"\0")
    return default_cache_dir() / "embeddings" / f"{digest.hexdigest()[:24]}.npy"


def save_vectors(path: Path, vectors: np.ndarray) -> None:
    """Write ``vectors`` under ``path`` whole (renamed into place: other processes of a bench
    or a test run read the same folder), then drop the oldest files past ``SAVED_FILES_KEPT``.
    A folder that cannot be written costs the saving, not the call."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.stem}.tmp-{os.getpid()}-{threading.get_ident()}.npy")
        np.save(temporary, vectors)
        os.replace(temporary, path)
        kept = sorted(path.parent.glob("*.npy"), key=lambda f: f.stat().st_mtime_ns)
        for old in kept[:-SAVED_FILES_KEPT]:
            old.unlink(missing_ok=True)
    except OSError:
        return
