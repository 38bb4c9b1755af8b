"""One live run per run directory: ``<run_dir>/run.lock``, held while a run works there.

Two processes on one run directory would write the same cycle files, the same Chroma
store (its ``PersistentClient`` is not multi-process safe) and the same SQLite
checkpoints. ``hold_run_dir`` takes an exclusive ``flock`` on the lock file and
writes the holder (pid, host, start time, command) into it; a second ``run``,
``run --resume`` or ``run --overwrite`` on the directory is refused in one line that
names the holder.

The kernel drops a ``flock`` when its process dies, so the lock of a killed run is
taken over without a person removing anything. Where the file system cannot lock
(some network mounts), the holder's pid decides: on this host, a pid that is gone
leaves a stale lock, taken over too.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from ..common.errors import RunError
from ..run_files import LOCK_FILE


class LockHolder(BaseModel):
    """Who holds a run directory: what the lock file says."""

    pid: int = Field(description="Process id of the run.")
    host: str = Field(description="Host name the run works on.")
    started: str = Field(description="When it took the lock (UTC, ISO 8601).")
    command: str = Field(default="", description="The command line of the run's process.")

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, since {self.started}: {self.command}".rstrip(": ")

    def alive(self) -> bool:
        """Whether the holder still runs, as far as this host can tell (another host's
        process cannot be seen: counted as alive)."""
        if self.host != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process: it exists
            return True
        return True


def _read_holder(fd: int) -> LockHolder | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 65536).decode(errors="replace")
    try:
        return LockHolder.model_validate_json(text) if text.strip() else None
    except ValidationError:
        return None


def _refusal(run_dir: Path, holder: LockHolder | None) -> RunError:
    who = holder.describe() if holder is not None else "a process that did not say who it is"
    return RunError(
        f"{run_dir} is in use by a live run ({who}); wait for it to end or stop it before "
        "running, resuming or overwriting a run there"
    )


def _locked(fd: int) -> bool | None:
    """Take the file's flock without waiting: True, False when another holds it, None
    when the file system cannot lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # ENOLCK, EOPNOTSUPP: a mount without flock
        return None
    return True


@contextlib.contextmanager
def hold_run_dir(run_dir: str | Path, say: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Hold ``run_dir`` (made if missing) for the block; raise ``RunError`` naming the
    holder when a live run holds it. ``say`` hears that a dead run's lock was taken over."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        locked = _locked(fd)
        previous = _read_holder(fd)
        if locked is False or (locked is None and previous is not None and previous.alive()):
            os.close(fd)
            raise _refusal(run_dir, previous)
        # A holder that was releasing may have unlinked the file we opened: lock the file
        # that is at the path now, or two runs would each hold a lock of their own.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    if previous is not None and previous.pid != os.getpid() and say is not None:
        say(f"{run_dir}: took over the lock of a run that is gone ({previous.describe()})")
    holder = LockHolder(
        pid=os.getpid(),
        host=socket.gethostname(),
        started=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command=" ".join(sys.argv),
    )
    os.ftruncate(fd, 0)
    os.pwrite(fd, holder.model_dump_json().encode(), 0)
    try:
        yield run_dir
    finally:
        # Unlinked while still locked, so no one can lock the old file and think it holds
        # the directory (the inode check above).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)
