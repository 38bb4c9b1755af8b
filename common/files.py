"""Files that a killed run never leaves half-written: atomic writes, directories, JSON lines.

Every file or directory a later step (or a resumed run) reads is written under
a temporary name and renamed into place, so a reader sees the old version or
the new one, never part of one.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

RecordT = TypeVar("RecordT", bound=BaseModel)


def default_cache_dir() -> Path:
    """``$COEVOLVE_CACHE``, else ``~/.cache/coevolve``: the built agents, converted models and
    embedded seed pools that later runs reuse."""
    env = os.environ.get("COEVOLVE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "coevolve"


def write_atomically(path: str | Path, text: str) -> None:
    """Write a text file so that a reader (or a resumed run) never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


@contextmanager
def atomic_directory(target: str | Path, hidden: bool = False) -> Iterator[Path]:
    """A fresh work directory beside ``target``, renamed to ``target`` when the block ends.

    The work directory is named ``<target>.partial-<pid>`` (``.<target>...`` with
    ``hidden``), so a crashed process's leftovers say whose they were. An
    existing ``target`` is replaced only once the new one is complete; if the
    block raises, the work directory is removed and ``target`` is untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = "." if hidden else ""
    work = target.parent / f"{prefix}{target.name}.partial-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        yield work
        if target.exists():
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def jsonl_lines(text: str) -> list[str]:
    """The lines of a JSON-lines text, split at "\\n" only.

    ``str.splitlines`` also splits at U+0085, U+2028 and U+2029, which JSON leaves
    unescaped inside strings: a model's reply holding one would tear its record in two.
    """
    return text.split("\n")


def load_jsonl(path: str | Path, record: type[RecordT]) -> list[RecordT]:
    """Records of one type from a JSON-lines file (blank lines skipped)."""
    return [
        record.model_validate_json(line)
        for line in jsonl_lines(Path(path).read_text(encoding="utf-8"))
        if line.strip()
    ]


def read_jsonl(path: str | Path, skip_torn: bool = False) -> list[Any]:
    """Plain JSON values from a JSON-lines file (blank lines skipped).

    ``skip_torn``: also skip lines that are not JSON, as a line cut short by a
    kill is in a file that is appended to (the pool, the outcome history).
    """
    rows = []
    for line in jsonl_lines(Path(path).read_text(encoding="utf-8")):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if not skip_torn:
                raise
    return rows


def dump_jsonl(path: str | Path, rows: Iterable[BaseModel | Mapping[str, object]]) -> None:
    """Write records or dicts as JSON lines, atomically."""
    write_atomically(
        path,
        "".join(
            (row.model_dump_json() if isinstance(row, BaseModel) else json.dumps(dict(row))) + "\n"
            for row in rows
        ),
    )
