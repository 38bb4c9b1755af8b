"""Package discovery for a repository whose root is the package.

pyproject.toml holds the metadata; this file only names the packages. setuptools' own
discovery (``[tool.setuptools.packages.find]``) cannot add the ``coevolve.`` prefix that
the root-as-package mapping needs, and a hand-written list once shipped a wheel without
``coevolve.synthesis``. So every folder with an ``__init__.py`` under the root is found
here, and ``tests/test_wheel.py`` installs the built wheel to prove it.
"""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# Folders at the root that are not part of the installed package (none has an __init__.py
# today; excluded by name so that adding one never ships them).
NOT_SHIPPED = ["tests", "tests.*", "examples", "examples.*", "docs", "docs.*", "build", "runs"]


class BuildWithoutThisFile(build_py):
    """The root is the package, so this file would ship as ``coevolve.setup``; and the
    scripts in bench/ run from a clone (a developer's measurements), so only the package
    the `coevolve bench` command imports, ``coevolve.bench.learning``, ships."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [
            found
            for found in modules
            if (found[0], found[1]) != ("coevolve", "setup")
            and not (found[0] == "coevolve.bench" and found[1] != "__init__")
        ]


setup(
    packages=["coevolve", *(f"coevolve.{name}" for name in find_packages(exclude=NOT_SHIPPED))],
    cmdclass={"build_py": BuildWithoutThisFile},
)
