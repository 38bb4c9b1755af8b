"""The test suite's pytest plugin (pyproject.toml's addopts loads it with -p).

The repository root is the package ``coevolve``, so it holds an ``__init__.py``
and pytest collects it as a test package named after the directory. A clone
under another name (a zip unpacks to ``coevolve-main/``) then fails at setup,
importing that ``__init__.py`` as a top-level module whose relative imports have
no parent. The root is collected as a plain directory instead: the tests import
the package as ``coevolve``, which the install provides under any directory name.
A conftest.py cannot do this: the root's node is made before any conftest below
it is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path: Path, parent: Any) -> Any:
    if path == parent.config.rootpath and (path / "__init__.py").is_file():
        return pytest.Dir.from_parent(parent, path=path)
    return None
