"""run_files.py is the one module that spells a run directory's or a cycle's file names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from coevolve import run_files
from coevolve.run_files import (
    CYCLE_FILE_NAMES,
    RUN_FILE_NAMES,
    UNREACHABLE_PREFIX,
    CycleFiles,
    RunFiles,
    SharedBaselineFiles,
)

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
NAMES = frozenset(RUN_FILE_NAMES + CYCLE_FILE_NAMES)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the module's, classes' and functions' docstring nodes (prose may name files)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, string) of every string in the code (docstrings left out, f-string parts
    included) that names a run or cycle file: the name itself, a path ending in it, or
    the unreachable episodes' prefix."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if id(node) in docstrings:
            continue
        last = node.value.rstrip("/").rsplit("/", 1)[-1]
        if last in NAMES or last.startswith(UNREACHABLE_PREFIX):
            found.append((node.lineno, node.value))
    return found


def package_sources(root: Path = PACKAGE_ROOT) -> list[Path]:
    """Every .py file of the package but tests/ and hidden folders (.venv)."""
    return [
        path
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).parts[0] != "tests"
        and not any(part.startswith(".") for part in path.relative_to(root).parts)
    ]


def test_the_grep_finds_a_spelled_name() -> None:
    source = (
        '"""Writes flagged.jsonl."""\n'
        'A = "flagged.jsonl"\n'
        'B = run / "cycles/001/eval.jsonl"\n'
        'C = f"{x}/unreachable-{stage}.jsonl"\n'
        'D = f"{x}.synthesized.jsonl"\n'  # coevolve synthesize's own output, not a cycle file
        'E = {"cycles": 2}\n'
    )
    assert [line for line, _ in spelled_names(source)] == [2, 3, 4]


def test_no_module_but_run_files_spells_a_run_or_cycle_file_name() -> None:
    spelled = [
        f"{path.relative_to(PACKAGE_ROOT)}:{line}: {text!r}"
        for path in package_sources()
        if path.name != "run_files.py" or path.parent != PACKAGE_ROOT
        for line, text in spelled_names(path.read_text())
    ]
    assert not spelled, (
        "name these files through coevolve.run_files (RunFiles, CycleFiles, its constants):\n"
        + "\n".join(spelled)
    )


def test_the_docstrings_list_every_name() -> None:
    documented = set(
        re.findall(
            r"^    (\S+\.(?:jsonl|json|yaml|sqlite|lock|log|png)) ", run_files.__doc__ or "", re.M
        )
    )
    assert documented == set(RUN_FILE_NAMES) - {run_files.BASELINE_FIGURES_FILE}
    in_cycle = set(re.findall(r"^    (\S+\.jsonl?) ", CycleFiles.__doc__ or "", re.M))
    assert in_cycle - {f"{UNREACHABLE_PREFIX}STAGE.jsonl"} == set(CYCLE_FILE_NAMES)


def test_run_files_name_paths_in_the_run_directory(tmp_path) -> None:
    files = RunFiles(tmp_path)
    assert files.config == tmp_path / "config.yaml"
    assert files.checkpoints == tmp_path / "checkpoints.sqlite"
    assert files.task_store == tmp_path / "task_store"
    assert files.adapter(3) == tmp_path / "adapters" / "cycle-3"
    assert files.failure_adapter(2) == tmp_path / "adapters" / "failure-cycle-2"
    assert files.cycle(1).folder == tmp_path / "cycles" / "001"
    assert files.cycles() == [] and files.read_synthesized_tasks() == []
    assert files.metrics_rows() == []
    files.cycle(4).write_rollouts([])
    assert [cycle.cycle for cycle in files.cycles()] == [4]
    files.metrics.write_text('{"cycle": 0}\n')
    assert files.metrics_rows() == [{"cycle": 0}]
    shared = SharedBaselineFiles(tmp_path / "baseline")
    assert shared.episodes.name == CycleFiles(tmp_path, 0).evaluation_episodes.name
