"""The test suite's pytest plugin (pyproject.toml's addopts loads it with -p).

It is loaded in every process of a run, pytest-xdist's workers included, and does three
things.

**The repository root is collected as a plain directory.** The repository root is the
package ``coevolve``, so it holds an ``__init__.py`` and pytest collects it as a test
package named after the directory. A clone under another name (a zip unpacks to
``coevolve-main/``) then fails at setup, importing that ``__init__.py`` as a top-level
module whose relative imports have no parent. The root is collected as a plain directory
instead: the tests import the package as ``coevolve``, which the install provides under
any directory name. A conftest.py cannot do this: the root's node is made before any
conftest below it is read.

**Workers share the cores.** In a pytest-xdist worker, ``OMP_NUM_THREADS`` (unless set)
becomes the cores per worker, set before any test imports torch: two workers on two cores
each running torch with two threads wait on each other. Subprocesses the tests start
inherit it.

**A budget per test.** After the run, every test whose setup, call and teardown together
took longer than ``COEVOLVE_TEST_BUDGET_S`` seconds (default ``DEFAULT_BUDGET_S``: its
share of ``make test``'s 10 minutes on an idle 2-core machine) is listed by name under
"tests over the budget". That list does not fail the run (a test's seconds depend on the
machine and its load, a test's result must not) unless ``COEVOLVE_TEST_BUDGET_STRICT=1``
is set: then a run whose tests all passed exits with status 1 when any is over.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

DEFAULT_BUDGET_S = 30.0


def _share_the_cores(workerinput: dict[str, Any]) -> None:
    workers = max(1, int(workerinput.get("workercount") or 1))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (cores or 1) // workers)))


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path: Path, parent: Any) -> Any:
    if path == parent.config.rootpath and (path / "__init__.py").is_file():
        return pytest.Dir.from_parent(parent, path=path)
    return None


def budget_s() -> float:
    """``COEVOLVE_TEST_BUDGET_S`` seconds, else ``DEFAULT_BUDGET_S``."""
    value = os.environ.get("COEVOLVE_TEST_BUDGET_S")
    if not value:
        return DEFAULT_BUDGET_S
    try:
        return float(value)
    except ValueError:
        raise pytest.UsageError(
            f"COEVOLVE_TEST_BUDGET_S={value!r} is not a number of seconds"
        ) from None


class DurationBudget:
    """Adds up each test's phases (in the process that reports them: xdist's controller
    receives its workers' reports) and names those over the budget at the end."""

    def __init__(self, budget: float, strict: bool) -> None:
        self.budget, self.strict = budget, strict
        self.seconds: dict[str, float] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def over(self) -> list[tuple[str, float]]:
        slow = [(nodeid, s) for nodeid, s in self.seconds.items() if s > self.budget]
        return sorted(slow, key=lambda item: -item[1])

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.strict and self.over() and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        over = self.over()
        if not over:
            return
        budget = f"{self.budget:g} s"
        terminalreporter.section(f"tests over the budget of {budget}", sep="=", yellow=True)
        for nodeid, seconds in over:
            terminalreporter.write_line(f"{seconds:7.1f} s  {nodeid}")
        if self.strict:
            terminalreporter.write_line(
                f"{len(over)} over the budget: the run fails (COEVOLVE_TEST_BUDGET_STRICT=1)"
            )
        else:
            terminalreporter.write_line(
                f"{len(over)} over the budget (COEVOLVE_TEST_BUDGET_S; the run does not fail "
                "for it unless COEVOLVE_TEST_BUDGET_STRICT=1)"
            )


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: its controller does the sums
        _share_the_cores(config.workerinput)
        return
    strict = os.environ.get("COEVOLVE_TEST_BUDGET_STRICT", "") not in ("", "0")
    config.pluginmanager.register(DurationBudget(budget_s(), strict), "coevolve-test-budget")
