"""The run's log file: what the trainers and the library log during a run goes to
``RUN_DIR/run.log``, not to the terminal.

A person watching ``coevolve run`` sees stage lines and one progress bar per
stage; the trainer's per-step log dicts (``{'loss': ..., 'learning_rate': ...}``,
logged by ``training.trainer_common`` to the ``coevolve.trainer`` logger) and the
roles' INFO lines land in the file. Warnings still reach the terminal, as before;
``verbose`` (``coevolve run --verbose``) shows everything there as well.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..run_files import LOG_FILE


@contextmanager
def run_log(run_dir: str | Path, verbose: bool = False) -> Iterator[Path]:
    """Send the ``coevolve`` loggers' records (INFO and up) to ``run_dir/run.log`` while
    the block runs; on stderr only warnings, or everything with ``verbose``."""
    logger = logging.getLogger("coevolve")
    path = Path(run_dir) / LOG_FILE
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    handlers: list[logging.Handler] = [to_file]
    # Without handlers anywhere, a warning reached stderr as its bare message through
    # logging's last resort; it still does. An application that set up logging keeps
    # getting the records through the root logger, as before.
    if verbose or not logging.getLogger().handlers:
        to_terminal = logging.StreamHandler(sys.stderr)
        to_terminal.setLevel(logging.INFO if verbose else logging.WARNING)
        handlers.append(to_terminal)
    level = logger.level
    logger.setLevel(logging.INFO)
    for handler in handlers:
        logger.addHandler(handler)
    try:
        yield path
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
            handler.close()
        logger.setLevel(level)
