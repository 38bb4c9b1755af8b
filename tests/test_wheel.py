"""The package a user installs: an sdist and a wheel built from the checkout, the wheel
installed into a fresh virtual environment with no source tree on its path, and the
installed package used from there (the command, every module, both graphs, one synthesis
pass on the tiny model).

The fresh environment reuses this one's dependencies through a ``.pth`` line naming its
site-packages: a path added that way is only appended to ``sys.path``, so the editable
install's own ``.pth`` hook there never runs and ``coevolve`` can only come from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

# Run inside the installed environment: every module of the installed package imports,
# from there and nowhere else, and the two graphs langgraph.json names are built.
CHECK_INSTALLED = r"""
import importlib, importlib.util, json, os, pkgutil, sys
from pathlib import Path
from types import SimpleNamespace

import coevolve

site = Path(os.environ["INSTALLED_SITE"]).resolve()
home = Path(coevolve.__file__).resolve().parent
assert home.is_relative_to(site), f"coevolve imported from {home}, not the wheel in {site}"
names = sorted(m.name for m in pkgutil.walk_packages(coevolve.__path__, "coevolve."))
for name in names:
    # A __main__ module runs its command when imported: found, not run.
    if name.endswith(".__main__"):
        origin = importlib.util.find_spec(name).origin
    else:
        origin = importlib.import_module(name).__file__
    assert Path(origin).resolve().is_relative_to(site), (name, origin)
built = {}
for graph_name, target in json.loads((home / "langgraph.json").read_text())["graphs"].items():
    module_name, attribute = target.split(":")
    factory = getattr(importlib.import_module(module_name), attribute)
    # Studio's call when it draws a graph: a server runtime with no run in it.
    graph = factory(SimpleNamespace(execution_runtime=None))
    built[graph_name] = sorted(graph.get_graph().nodes)
print(json.dumps({"modules": names, "graphs": built}))
"""


def _source_copy(destination: Path) -> Path:
    """The files a clone of this checkout has (tracked, and new files git does not ignore)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def _run(*command: str, cwd: Path, env: dict[str, str] | None = None):
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command[:4]}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _package_folders(names: list[str]) -> set[str]:
    """Folders of ``coevolve/`` that hold Python modules, from an archive's member names."""
    return {str(Path(name).parent) for name in names if name.endswith("/__init__.py")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A wheel built from the sdist built from the checkout, installed into a new venv."""
    work = tmp_path_factory.mktemp("wheel")
    source = _source_copy(work / "source")
    dist = work / "dist"
    # The sdist through setuptools' PEP 517 hook (what `python -m build --sdist` calls):
    # no build isolation, so no package index is needed.
    _run(
        sys.executable,
        "-c",
        "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))",
        str(dist),
        cwd=source,
    )
    (sdist,) = dist.glob("coevolve-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(work / "unpacked", filter="data")
    (unpacked,) = (work / "unpacked").iterdir()
    _run(
        *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"),
        *("--no-index", "-w", str(dist), str(unpacked)),
        cwd=work,
    )
    (wheel,) = dist.glob("coevolve-*.whl")

    venv = work / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv), cwd=work)
    python = venv / "bin" / "python"
    fresh_site = Path(
        _run(
            str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=work
        ).stdout.strip()
    )
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (fresh_site / "reuse-dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    # --ignore-installed: pip must not touch the editable coevolve it sees through the .pth.
    _run(
        *(str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index"),
        *("--ignore-installed", "--disable-pip-version-check", str(wheel)),
        cwd=work,
    )
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {
        "work": work,
        "sdist": sdist,
        "wheel": wheel,
        "venv": venv,
        "site": fresh_site,
        "env": env,
    }


def test_the_sdist_and_the_wheel_hold_every_package_folder(installed):
    shipped = {
        str(Path("coevolve") / path.parent.relative_to(ROOT))
        for path in ROOT.rglob("__init__.py")
        if path.relative_to(ROOT).parts[0] not in {"tests", "examples", "build"}
        and not path.relative_to(ROOT).parts[0].startswith(".")
    }
    shipped = {name.removesuffix("/.") for name in shipped}
    assert "coevolve/graph" in shipped and "coevolve/loop" in shipped
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        in_wheel = _package_folders(wheel.namelist())
        data = set(wheel.namelist())
    assert in_wheel == shipped, f"missing from the wheel: {sorted(shipped - in_wheel)}"
    assert {
        "coevolve/langgraph.json",
        "coevolve/py.typed",
        "coevolve/configs/quickstart.yaml",
        "coevolve/bench/learning/units.py",  # `coevolve bench learning`
    } <= data
    # the bench's scripts run from a clone: none is in the wheel
    scripts = {f"coevolve/bench/{path.name}" for path in (ROOT / "bench").glob("*.py")}
    assert scripts & data == {"coevolve/bench/__init__.py"}
    with tarfile.open(installed["sdist"]) as sdist:
        members = [name.split("/", 1)[1] for name in sdist.getnames() if "/" in name]
    assert {"setup.py", "pyproject.toml", "graph/synthesis/graph.py"} <= set(members)


def test_the_installed_command_imports_every_module_and_builds_both_graphs(installed):
    venv, env, work = installed["venv"], installed["env"], installed["work"]
    helped = _run(str(venv / "bin" / "coevolve"), "--help", cwd=work, env=env)
    assert "synthesize" in helped.stdout and "run" in helped.stdout
    checked = _run(
        *(str(venv / "bin" / "python"), "-c", CHECK_INSTALLED),
        cwd=work,
        env={**env, "INSTALLED_SITE": str(installed["site"])},
    )
    found = json.loads(checked.stdout.strip().splitlines()[-1])
    assert "coevolve.graph.synthesis.graph" in found["modules"]
    assert {"synthesis", "cycle"} == set(found["graphs"])
    assert {"prepare", "branch", "dedup"} <= set(found["graphs"]["synthesis"])
    assert {"rollout", "signals", "synthesis", "train", "evaluate"} <= set(found["graphs"]["cycle"])


def test_the_installed_package_runs_a_synthesis_pass_on_the_tiny_model(installed, tiny_build):
    venv, env, work = installed["venv"], installed["env"], installed["work"]
    coevolve = str(venv / "bin" / "coevolve")
    rollouts = work / "rollouts.jsonl"
    _run(
        *(coevolve, "eval", "--env", "world", "--split", "train", "--limit", "6", "--k", "2"),
        *("--temperature", "0.9", "--max-tool-calls", "2", "--policy", str(tiny_build)),
        *("--save", str(rollouts)),
        cwd=work,
        env=env,
    )
    assert len(rollouts.read_text().splitlines()) == 12
    accepted = work / "synthesized.jsonl"
    passed = _run(
        *(coevolve, "synthesize", str(rollouts), "--store", str(work / "store")),
        *("--out", str(accepted), "--json"),
        cwd=work,
        env=env,
    )
    counts = json.loads(passed.stdout[passed.stdout.index("{") :])
    assert counts, passed.stdout
    assert accepted.exists()
