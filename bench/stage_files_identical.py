"""Whether two quick-bench runs of the same arms wrote the same stage files.

    python bench/stage_files_identical.py OUT_A OUT_B [--arms static,coevolve-oracle]

OUT_A and OUT_B are ``coevolve bench learning --quick --seeds 1 --arms ... --out OUT`` run at
two commits (each from a worktree of its commit). A verdict counts an arm's finished units
from an older commit only when these files are identical for that arm: every file under each
unit's ``cycles/`` (rollouts, flags, synthesized tasks, training rows, evaluations) and
``adapters/`` (the weights among them). Two things are read as data rather than bytes: the
seconds and steps a second of a training step (``train_time_s``, ``steps_per_s``), and the
order of ``adapter_config.json``'s ``target_modules`` (PEFT writes a set, in the order of
the process's string hashing). Exit code 1 when any file differs or is missing on one side.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

TIMINGS = frozenset({"train_time_s", "steps_per_s"})


def _without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def fingerprint(path: Path) -> str:
    """The file's sha256, of its JSON with timings dropped and sets sorted where it is one
    of the JSON files above."""
    data = path.read_bytes()
    if path.suffix == ".json":
        value = _without_timings(json.loads(data))
        if path.name == "adapter_config.json" and isinstance(value.get("target_modules"), list):
            value["target_modules"] = sorted(value["target_modules"])
        data = json.dumps(value, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def stage_files(unit: Path) -> dict[str, str]:
    return {
        str(path.relative_to(unit)): fingerprint(path)
        for folder in ("cycles", "adapters")
        for path in sorted((unit / folder).rglob("*"))
        if path.is_file()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_a", type=Path)
    parser.add_argument("out_b", type=Path)
    parser.add_argument("--arms", default="static,coevolve-oracle", help="Comma-separated.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    differ = False
    for arm in args.arms.split(","):
        name = f"{arm}-seed{args.seed}"
        a, b = stage_files(args.out_a / name), stage_files(args.out_b / name)
        changed = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
        one_side = sorted(a.keys() ^ b.keys())
        same = len(a.keys() & b.keys()) - len(changed)
        print(f"{name}: {same} of {len(a.keys() | b.keys())} stage files identical", end="")
        print(f"; differ: {changed}" if changed else "", end="")
        print(f"; on one side only: {one_side}" if one_side else "")
        differ |= bool(changed or one_side or not a)
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
