"""Follow the run config through one ``coevolve.run``: the functions that receive it.

A reader who follows the config from ``coevolve.run`` goes from function to function
wherever the config (or one of its sections: ``config.training``, ``config.bootstrap``,
...) is handed on. This script takes that walk at run time, so that two commits can be
measured the same way (issue 72, item 5):

- a **stop** is a function of the package that is called with the config or a section of
  it among its arguments, counted once, in the order of its first call;
- **files**: the distinct files of the stops;
- a **climb back up**: a stop whose file sits in a folder above the previous stop's
  (``training/sft_trainer.py`` to ``training/bootstrap/build.py`` is down; back is up);
- a **return**: a stop in a file the walk had already left.

The run is the quickstart's loop shrunk to the test suite's sizes (the tiny bootstrap
model, built afresh in a temporary cache so its build is walked too, one cycle, offline
roles). Stops inside the bootstrap build (``training/bootstrap/``) are counted apart.

    python bench/config_walk.py            # the counts
    python bench/config_walk.py --stops    # and every stop, in order
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import threading
from pathlib import Path, PurePosixPath
from typing import Any


def _package_root() -> Path:
    """The folder of the coevolve that is imported (a worktree's, on its PYTHONPATH)."""
    import coevolve

    assert coevolve.__file__ is not None, "coevolve is a regular package"
    return Path(coevolve.__file__).resolve().parent


def _config_dict(run_dir: Path) -> dict[str, Any]:
    import yaml

    from coevolve.config import load_config

    root = _package_root()
    base = load_config(root / "configs" / "quickstart.yaml").model_dump(mode="json")
    quick = yaml.safe_load((root / "training" / "presets" / "bench-quick.yaml").read_text())
    tiny = yaml.safe_load((root / "training" / "presets" / "bootstrap-tiny.yaml").read_text())
    base.update(quick)
    base["bootstrap"] = {**base["bootstrap"], **tiny}
    base["run_dir"] = str(run_dir)
    base["synthesis"] = {**base.get("synthesis", {}), **quick.get("synthesis", {})}
    return base


def _section_types(config: Any) -> set[type]:
    """The config's type and the types of every section under it."""
    from pydantic import BaseModel

    found: set[type] = set()

    def visit(value: Any) -> None:
        if isinstance(value, BaseModel) and type(value) not in found:
            found.add(type(value))
            for name in type(value).model_fields:
                visit(getattr(value, name))

    visit(config)
    return found


def walk() -> list[tuple[str, str]]:
    """The stops of one run, as (file relative to the package, function)."""
    from coevolve.config import CoevolveConfig
    from coevolve.runner import run

    package = _package_root()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["COEVOLVE_CACHE"] = str(Path(scratch) / "cache")
        config = CoevolveConfig.model_validate(_config_dict(Path(scratch) / "run"))
        types = tuple(_section_types(config))
        stops: dict[tuple[str, str], None] = {}

        @functools.cache
        def resolved(filename: str) -> Path:
            return Path(filename).resolve()

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event != "call":
                return
            code = frame.f_code
            if code.co_filename.startswith("<"):  # generated code (dataclass __init__, ...)
                return
            path = resolved(code.co_filename)
            if not path.is_relative_to(package):
                return
            if {"tests", ".venv"} & set(path.relative_to(package).parts):
                return
            names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            if any(isinstance(frame.f_locals.get(name), types) for name in names):
                relative = path.relative_to(package).as_posix()
                stops.setdefault((relative, code.co_qualname), None)

        # The stages' work runs in worker threads too (asyncio.to_thread): profile them all.
        threading.setprofile(profile)
        sys.setprofile(profile)
        try:
            run(config, progress=False)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    return list(stops)


def counts(stops: list[tuple[str, str]]) -> dict[str, int]:
    files_seen: list[str] = []
    climbs = returns = 0
    previous: str | None = None
    for file, _ in stops:
        if previous is not None and file != previous:
            here, before = PurePosixPath(file).parent, PurePosixPath(previous).parent
            if here != before and here in before.parents:
                climbs += 1
            if file in files_seen:
                returns += 1
        if file not in files_seen:
            files_seen.append(file)
        previous = file
    bootstrap = sum(file.startswith("training/bootstrap/") for file, _ in stops)
    return {
        "stops": len(stops),
        "files": len(files_seen),
        "climbs_back_up": climbs,
        "returns": returns,
        "stops_in_bootstrap_build": bootstrap,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", action="store_true", help="Print every stop, in order.")
    args = parser.parse_args()
    stops = walk()
    if args.stops:
        for n, (file, function) in enumerate(stops, 1):
            print(f"{n:3d}  {file}:{function}")
    for name, value in counts(stops).items():
        print(f"{name}: {value}")


if __name__ == "__main__":
    main()
