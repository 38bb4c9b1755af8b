"""Which code ran a bench unit: its git commit, and a fingerprint of the code itself.

A unit's config says what it ran, not which code ran it. Two units of one config run at
two commits can differ by the code alone (issue 71: static moved from 47.2 to 42.4% at
cycle 1 between two commits), so a paired difference across commits may be the code's,
not the arms'. Every unit records both; a unit counts only at today's fingerprint, unless
the user accepts another (``CodeAcceptance``).

The commit names the code for a person; the fingerprint decides, because it also sees a
tree with changes that are not committed, and it does not change when only code a unit
never runs does (the report's tables, the tests, the docs).
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict

PACKAGE_ROOT = Path(__file__).resolve().parents[2]

# What a fingerprint leaves out of the package's modules, and why: none of it runs inside
# a unit, so a change there must not make finished units stale.
# - the command line: it only turns options into the base config and run_ablation's
#   arguments, and the config is compared value by value (unit_still_counts);
# - arms.py: it only builds each unit's config, compared the same way;
# - the report: it reads finished units (tables, statistics, figures);
# - bench/*.py: scripts a person runs by hand (bench/rollout.py, ...), never a unit;
# - setup.py: packaging.
NOT_RUN_BY_A_UNIT_FOLDERS = ("tests", "commands")
NOT_RUN_BY_A_UNIT_FILES = (
    "setup.py",
    "cli.py",
    "__main__.py",
    "bench/learning/arms.py",
    "bench/learning/report.py",
    "bench/learning/stats.py",
    "bench/learning/figures.py",
)
# Files besides the modules that a run reads (pyproject.toml's package data): the BFCL
# split and the tiny model's presets. configs/*.yaml are left out: a unit's config holds
# what it took from them, compared value by value.
RUN_DATA_FOLDERS = ("envs/data", "training/presets")
RUN_DATA_SUFFIXES = (".json", ".yaml")

FINGERPRINT_LENGTH = 16  # hex digits of the SHA-256: short enough to type after --accept-code


def unit_code_files(root: Path | None = None) -> list[Path]:
    """The files a code fingerprint covers, relative to the package root ``root``: every
    ``.py`` of the package's modules (folders with an ``__init__.py``, as setup.py finds
    them: not tests/, docs/, examples/ or scripts/) less ``NOT_RUN_BY_A_UNIT_*``, and the
    run's data files (``RUN_DATA_FOLDERS``)."""
    root = root or PACKAGE_ROOT
    files: list[Path] = []

    def walk(folder: Path) -> None:
        for path in sorted(folder.iterdir()):
            relative = path.relative_to(root)
            if path.is_dir():
                package = (path / "__init__.py").is_file()
                if package and relative.as_posix() not in NOT_RUN_BY_A_UNIT_FOLDERS:
                    walk(path)
            elif path.suffix == ".py" and relative.as_posix() not in NOT_RUN_BY_A_UNIT_FILES:
                if relative.parent.as_posix() == "bench" and path.name != "__init__.py":
                    continue  # a script run by hand
                files.append(relative)

    walk(root)
    for folder in RUN_DATA_FOLDERS:
        if (root / folder).is_dir():
            files += [
                path.relative_to(root)
                for path in sorted((root / folder).iterdir())
                if path.is_file() and path.suffix in RUN_DATA_SUFFIXES
            ]
    return sorted(files, key=lambda path: path.as_posix())


def code_fingerprint(root: Path | None = None) -> str:
    """A hash of the code that runs a unit (``unit_code_files``): the first
    ``FINGERPRINT_LENGTH`` hex digits of a SHA-256 over each file's path and bytes. The same
    files give the same fingerprint in any checkout or install; a changed, added or removed
    module gives another."""
    root = root or PACKAGE_ROOT
    digest = hashlib.sha256()
    for relative in unit_code_files(root):
        content = hashlib.sha256((root / relative).read_bytes()).hexdigest()
        digest.update(f"{PurePosixPath(relative)}\0{content}\n".encode())
    return digest.hexdigest()[:FINGERPRINT_LENGTH]


def package_commit(root: Path | None = None) -> str | None:
    """The git commit of the coevolve checkout at ``root`` (default: this package), with
    ``+modified`` when tracked files differ from it (a dirty tree); None outside a git
    checkout.

    Benches run for hours from a worktree of a fixed commit, and the docs cite the commit
    beside each figure.
    """
    root = root or PACKAGE_ROOT

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no")
    return f"{commit}+modified" if changed else commit


def parse_fingerprints(items: list[str]) -> frozenset[str]:
    """Fingerprints as the user gives them (each item one, or several comma-separated);
    ValueError naming any that is not ``FINGERPRINT_LENGTH`` lower-case hex digits."""
    fingerprints = {part.strip() for item in items for part in item.split(",") if part.strip()}
    malformed = sorted(
        fp
        for fp in fingerprints
        if len(fp) != FINGERPRINT_LENGTH or any(c not in "0123456789abcdef" for c in fp)
    )
    if malformed:
        raise ValueError(
            f"a code fingerprint is {FINGERPRINT_LENGTH} hex digits, as the report and the "
            f"bench's lines print it after 'code' (e.g. code 3f9a0c1d2e4b5a67); got "
            + ", ".join(map(repr, malformed))
        )
    return frozenset(fingerprints)


UNRECORDED = "no code fingerprint recorded"


def code_label(fingerprint: str | None) -> str:
    """A unit's code as the report names it: its fingerprint, or that it has none (a unit
    saved before fingerprints were kept)."""
    return f"code {fingerprint}" if fingerprint else UNRECORDED


class CodeAcceptance(BaseModel):
    """Which units' code counts beside today's: the fingerprints the user accepted
    (``--accept-code``), or any code, units without a fingerprint included (``--any-code``)."""

    model_config = ConfigDict(frozen=True)

    fingerprints: frozenset[str] = frozenset()
    any_code: bool = False

    def counts(self, fingerprint: str | None, today: str) -> bool:
        """Whether a unit that ran at ``fingerprint`` counts in a bench run at ``today``."""
        if self.any_code or fingerprint == today:
            return True
        return fingerprint is not None and fingerprint in self.fingerprints

    def options(self) -> str:
        """The command-line options that gave this acceptance ("" for none)."""
        if self.any_code:
            return "--any-code"
        return " ".join(f"--accept-code {fp}" for fp in sorted(self.fingerprints))
