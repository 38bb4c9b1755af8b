"""The package's import graph, built from the source, has no circles.

Every import counts, imports inside functions included; only ``if TYPE_CHECKING:``
blocks are left out (they never run). Relative imports are resolved, only modules
of the package are nodes, and tests/, examples/ and the scripts in bench/ are not part
of it (the learning bench, bench/learning/, is).

Run as a script to draw the graph at folder level as Mermaid (docs/architecture-imports.md,
linked from the "Import graph" section of docs/architecture.md):

    python tests/test_import_graph.py --mermaid
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

PACKAGE = "coevolve"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
EXCLUDED_FOLDERS = frozenset({"tests", "examples"})
SCRIPT_FOLDER = "bench"  # its scripts run from a clone; bench/learning/ is the package's
# The files at the package root, drawn as three nodes of the folder graph: the bottom
# floor, the composition and driver, and the public face (the other root modules).
ROOT_NODES = {
    "records": "records, run_files",
    "run_files": "records, run_files",
    "config": "config, runner",
    "runner": "config, runner",
}
ROOT_MODULES = "public face"


def module_files(root: Path = PACKAGE_ROOT) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[0] in EXCLUDED_FOLDERS or any(part.startswith(".") for part in parts):
            continue
        if parts[0] == SCRIPT_FOLDER and len(parts) == 2 and parts[1] != "__init__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join((PACKAGE, *parts))] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(
    node: ast.AST, type_checking: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import under ``node``, at any depth, outside ``if TYPE_CHECKING:`` bodies
    (inside them too with ``type_checking``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        yield from _import_nodes(child, type_checking)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module an ``from ... import`` names, relative levels resolved."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(root: Path = PACKAGE_ROOT, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports (counting ``if TYPE_CHECKING:`` imports too
    with ``type_checking``)."""
    modules = module_files(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _import_nodes(tree, type_checking):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                target = _absolute(name, is_package, node)
                targets = [target] + [f"{target}.{alias.name}" for alias in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative depth-first search: (node, the neighbours still to visit).
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, neighbours = work[-1]
            for neighbour in neighbours:
                if neighbour not in index:
                    index[neighbour] = low[neighbour] = len(index)
                    stack.append(neighbour)
                    on_stack.add(neighbour)
                    work.append((neighbour, iter(sorted(graph[neighbour]))))
                    break
                if neighbour in on_stack:
                    low[node] = min(low[node], index[neighbour])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def folder_of(module: str) -> str:
    """The top-level folder a module lives in (``envs``, ``graph``, ...), or for a root
    module its node (ROOT_NODES, else ROOT_MODULES)."""
    parts = module.split(".")[1:]
    folder = parts[0] if parts else ""
    if folder and (PACKAGE_ROOT / folder).is_dir():
        return folder
    return ROOT_NODES.get(folder, ROOT_MODULES)


def folder_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The import graph with the modules of each top-level folder merged into one node."""
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = folder_of(module)
        folders.setdefault(source, set())
        folders[source].update(folder_of(t) for t in targets if folder_of(t) != source)
    return folders


def mermaid(folders: Mapping[str, set[str]]) -> str:
    """A Mermaid flowchart of a folder-level graph, one edge per line, sorted."""
    ids = {folder: re.sub(r"\W+", "_", folder) for folder in folders}
    lines = ["flowchart TD"]
    lines += [f'    {ids[f]}["{f}"]' for f in sorted(folders) if ids[f] != f]
    for source in sorted(folders):
        lines += [f"    {ids[source]} --> {ids[target]}" for target in sorted(folders[source])]
    return "\n".join(lines)


# --------------------------------------------------------------------------- tests


def test_the_graph_sees_imports_inside_functions() -> None:
    graph = import_graph()
    # graph/cycle/stages.py imports the training step inside its train stage only.
    assert "coevolve.graph.cycle.training_step" in graph["coevolve.graph.cycle.stages"]
    assert "coevolve.graph.cycle.graph" in graph["coevolve.runner"]
    assert not any(module.startswith("coevolve.tests") for module in graph)


def test_no_import_circles() -> None:
    # Type-only imports count too: a circle through them is one a reader still walks.
    found = circles(import_graph(type_checking=True))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


# Inside a room. A folder below the top level (a room's sub-package: envs/world/,
# training/grpo/, ...) is one thing to the modules around it: collapse it (its own
# subfolders included) into one node, leave every other module as it is, and the graph
# has no circle. An arrow back up is an import from inside the folder to a module of
# the room that itself reaches into the folder: training/dpo/trainer.py importing
# training/config.py, which imported training/dpo/config.py, was one; envs/world/env.py
# importing envs/diagnosis.py, which imported envs/world/verifier.py, another. Between
# rooms, FLOORS says which way arrows run (test_no_import_runs_from_a_lower_floor_...).


def subfolders(graph: Mapping[str, set[str]]) -> list[str]:
    """The package's folders below the top level, as dotted names (``coevolve.envs.world``)."""
    return sorted(
        module
        for module, path in module_files().items()
        if path.name == "__init__.py" and module.count(".") >= 2 and module in graph
    )


def collapsed(graph: Mapping[str, set[str]], folder: str) -> dict[str, set[str]]:
    """``graph`` with the modules of ``folder`` (at any depth) merged into one node."""

    def node(module: str) -> str:
        return folder if module == folder or module.startswith(folder + ".") else module

    merged: dict[str, set[str]] = {}
    for module, targets in graph.items():
        merged.setdefault(node(module), set()).update(node(t) for t in targets)
    for module, targets in merged.items():
        targets.discard(module)
    return merged


def arrows_back_up(graph: Mapping[str, set[str]]) -> dict[str, list[str]]:
    """Per subfolder, the modules outside it on a circle through it once it is collapsed
    (nothing when there is no arrow back up)."""
    found = {}
    for folder in subfolders(graph):
        for circle in circles(collapsed(graph, folder)):
            if folder in circle:
                found[folder] = [module for module in circle if module != folder]
    return found


def test_arrows_back_up_inside_a_room_are_found() -> None:
    graph = {
        "coevolve.training.config": {"coevolve.training.dpo.config"},
        "coevolve.training.dpo": set(),
        "coevolve.training.dpo.config": set(),
        "coevolve.training.dpo.trainer": {"coevolve.training.config"},
    }
    # no circle between modules, but one between the folder and training/config.py
    assert not circles(graph)
    collapsed_graph = collapsed(graph, "coevolve.training.dpo")
    assert collapsed_graph["coevolve.training.dpo"] == {"coevolve.training.config"}
    assert circles(collapsed_graph) == [["coevolve.training.config", "coevolve.training.dpo"]]
    assert "coevolve.envs.world" in subfolders(import_graph())


def test_no_arrow_runs_back_up_inside_a_room() -> None:
    # Type-only imports count, as for the circles between modules.
    found = arrows_back_up(import_graph(type_checking=True))
    assert not found, "arrows back up into a folder's room (folder <-> modules):\n" + "\n".join(
        f"{folder} <-> {', '.join(modules)}" for folder, modules in sorted(found.items())
    )


def test_the_architecture_doc_draws_todays_import_graph() -> None:
    doc = (PACKAGE_ROOT / "docs" / "architecture-imports.md").read_text()
    drawn = re.search(r"```mermaid\n(flowchart TD\n.*?)```", doc, re.S)
    assert drawn, "docs/architecture-imports.md has no import graph (```mermaid flowchart TD)"
    assert drawn.group(1).strip() == mermaid(folder_graph(import_graph())), (
        "docs/architecture-imports.md's import graph is out of date: replace it with the output of "
        "`python tests/test_import_graph.py --mermaid`"
    )


# coevolve.config composes the config sections, which live beside the code they
# configure; only the modules that turn a whole config (or a YAML file) into a running
# thing may import it, so a part of the loop depends on its own section, never on all
# of them. Counted with type-only imports: annotating with CoevolveConfig is depending on it.
CONFIG_ROOT = f"{PACKAGE}.config"
CONFIG_ENTRY_POINTS = frozenset(
    {
        f"{PACKAGE}.runner",  # coevolve.run / resume: a path, a dict or a CoevolveConfig
        f"{PACKAGE}.bench.learning.units",  # coevolve bench learning: one whole config per arm
        # The composition: the policy, roles, store and evaluation tasks of a run from a
        # whole CoevolveConfig; the cycle's runtime that carries that config to the nodes;
        # LangGraph Studio's runtime from a YAML path.
        f"{PACKAGE}.loop.build_runtime",
        f"{PACKAGE}.graph.cycle.context",
        f"{PACKAGE}.loop.studio",
    }
)
CONFIG_ENTRY_FOLDERS = (f"{PACKAGE}.commands.",)  # the CLI: loads YAML, prints ConfigError


def test_only_entry_points_import_the_config_composition() -> None:
    graph = import_graph(type_checking=True)
    # the graph counts type-only imports: agents/roles/llm.py imports its section for typing only
    assert "coevolve.agents.config" in graph["coevolve.agents.roles.llm"]
    assert "coevolve.agents.config" not in import_graph()["coevolve.agents.roles.llm"]
    importers = {module for module, targets in graph.items() if CONFIG_ROOT in targets}
    assert "coevolve.runner" in importers
    below = sorted(
        module
        for module in importers
        if module not in CONFIG_ENTRY_POINTS and not module.startswith(CONFIG_ENTRY_FOLDERS)
    )
    assert below == [], (
        f"{', '.join(below)} import {CONFIG_ROOT}; import the section from its home "
        "(envs/config.py, agents/config.py, graph/synthesis/config.py, training/config.py, "
        "config_base.py for ConfigError) instead"
    )


# The floors, lowest first: a module imports only from its own floor or lower ones. A
# floor is top-level folders and root modules ("" is the package's __init__.py). records.py
# and run_files.py are the bottom floor every folder stands on; config.py and runner.py sit
# above everything they compose and drive (the config's entry points below them import it:
# test_only_entry_points_import_the_config_composition says which); testing/ is the test
# suite's helpers, above everything, and no production module imports it.
FLOORS: tuple[frozenset[str], ...] = tuple(
    frozenset(floor)
    for floor in (
        {"common"},
        {"records", "run_files"},
        {"envs"},
        {"memory"},
        {"agents"},
        {"outputs"},
        {"training"},
        {"graph"},
        {"loop"},
        {"config", "runner"},
        {"bench"},
        {"commands"},
        {"cli", "__main__", ""},
        {"testing"},
    )
)
# Arrows that still run upward, each to be removed: none may be added.
KNOWN_UPWARD: frozenset[tuple[str, str]] = frozenset()


def floor_of(module: str) -> int:
    """The floor of a package module: the index in FLOORS of its top-level folder or file."""
    parts = module.split(".")[1:]
    name = parts[0] if parts else ""
    found = [index for index, floor in enumerate(FLOORS) if name in floor]
    assert found, f"{module} is on no floor: add {name!r} to FLOORS in tests/test_import_graph.py"
    return found[0]


def upward_arrows(graph: Mapping[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a module to one on a higher floor, but a config entry point's import
    of the composition (governed by its own test)."""
    return sorted(
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if floor_of(target) > floor_of(module)
        and not (
            target == CONFIG_ROOT
            and (module in CONFIG_ENTRY_POINTS or module.startswith(CONFIG_ENTRY_FOLDERS))
        )
    )


def test_no_import_runs_from_a_lower_floor_to_a_higher_one() -> None:
    # Type-only imports count: annotating with a higher floor's type is depending on it.
    graph = import_graph(type_checking=True)
    assert floor_of("coevolve.run_files") < floor_of("coevolve.outputs.export")
    assert ("coevolve.memory.store", "coevolve.graph.cycle.context") in upward_arrows(
        {"coevolve.memory.store": {"coevolve.graph.cycle.context"}}
    )
    upward = [arrow for arrow in upward_arrows(graph) if arrow not in KNOWN_UPWARD]
    assert not upward, "imports from a lower floor to a higher one (FLOORS):\n" + "\n".join(
        f"{module} -> {target}" for module, target in upward
    )
    gone = sorted(KNOWN_UPWARD - set(upward_arrows(graph)))
    assert not gone, f"remove these from KNOWN_UPWARD, they are gone: {gone}"


TESTING = f"{PACKAGE}.testing"


def imports_of_testing(path: Path, module: str) -> list[str]:
    """The imports of coevolve.testing (or a module of it) in one source file, type-only
    ones included; ``module`` is the file's dotted name, for relative imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in _import_nodes(tree, type_checking=True):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            target = _absolute(module, path.name == "__init__.py", node)
            names = [target] + [f"{target}.{alias.name}" for alias in node.names]
        found += [name for name in names if name == TESTING or name.startswith(TESTING + ".")]
    return sorted(set(found))


def test_no_production_module_imports_the_test_helpers() -> None:
    # Every .py file of the repository but tests/ and testing/ itself: the package's
    # modules, the bench scripts and the examples. The tiny model's presets, which
    # `coevolve bootstrap --tiny` and `bench learning --quick` read, live in
    # training/tiny_presets.py; testing/presets.py re-exports them for the tests.
    offenders = {}
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        parts = path.relative_to(PACKAGE_ROOT).with_suffix("").parts
        if parts[0] in ("tests", "testing") or any(part.startswith(".") for part in parts):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        imported = imports_of_testing(path, ".".join((PACKAGE, *parts)))
        if imported:
            offenders[str(path.relative_to(PACKAGE_ROOT))] = imported
    assert not offenders, f"production code imports {TESTING}: {offenders}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mermaid", action="store_true", help="print the folder-level graph as Mermaid"
    )
    arguments = parser.parse_args()
    module_graph = import_graph()
    if arguments.mermaid:
        print(mermaid(folder_graph(module_graph)))
    else:
        for circle in circles(module_graph):
            print(" <-> ".join(circle))


MAX_SOURCE_LINES = 500


def test_no_source_file_is_over_500_lines() -> None:
    # A file a maintainer can read in one sitting; tests are exempt.
    long = {
        str(path.relative_to(PACKAGE_ROOT)): lines
        for path in sorted(PACKAGE_ROOT.rglob("*.py"))
        if path.relative_to(PACKAGE_ROOT).parts[0] != "tests"
        and not any(part.startswith(".") for part in path.relative_to(PACKAGE_ROOT).parts)
        and (lines := len(path.read_text().splitlines())) > MAX_SOURCE_LINES
    }
    assert not long, f"split these files (over {MAX_SOURCE_LINES} lines): {long}"


def test_every_public_name_of_the_package_resolves() -> None:
    # The lazy names (run, resume, RunResult, CycleSummary) point into modules that may move.
    import coevolve

    assert all(getattr(coevolve, name) is not None for name in coevolve.__all__)
