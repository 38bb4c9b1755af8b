"""Benchmarks, in one place.

- ``bench/learning/``: the learning bench that ``coevolve bench learning`` runs
  (arms, resumable units, the report with intervals and power, its figures).
- ``bench/*.py``: scripts that measure speed and memory, run from a clone as
  ``.venv/bin/python bench/<name>.py`` (each one's docstring says what it prints).
  They are not imported by the package.

docs/benchmarks.md holds every figure with the command and the machine that made it.
"""
