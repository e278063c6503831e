"""A per-run lock that dies with its holder, so two launches never run one job at once.

The lock is `fcntl.flock` on a `.lock` file in the run directory. The kernel
releases it when the holding process exits, however it exits (SIGKILL, a node
reboot of a local disk, an OOM kill), so a crashed holder never blocks a job.
The file itself stays; it is the lock, not the holding, that matters, and it
names the last holder (host, pid, time) for messages.

Shared filesystems: on NFS (Linux client, NFSv4 or v3 with lockd) flock is
carried out as a whole-file POSIX lock that every client sees. Lustre honours it
across nodes only when mounted with `-o flock` (with `-o localflock` it is
node-local). A filesystem that refuses locks altogether gets one warning and
runs unlocked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from domaingen.errors import DomaingenError

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
RUNNING_ELSEWHERE = "running elsewhere"
_NO_LOCK_SUPPORT = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


class RunLockedError(DomaingenError):
    """Another live process holds the run's lock."""


def holder_note(path: Path) -> str:
    """Who last took the lock at `path` (host, pid, time), as written by `run_lock`."""
    try:
        text = path.read_text().strip()
    except OSError:
        return ""
    return text or ""


def _take(fd: int, tries: int = 4, pause_s: float = 0.05) -> None:
    # a few quick tries: `is_locked` (sweep status) holds a shared lock for microseconds
    for attempt in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt == tries - 1:
                raise
            time.sleep(pause_s)


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike) -> Iterator[None]:
    """Hold the lock of `run_dir` for the duration of the block; never waits.

    Raises RunLockedError at once when another process (or another open of the
    file in this process) holds it.
    """
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    lock_path = path / LOCK_FILE
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            _take(fd)
        except BlockingIOError:
            holder = holder_note(lock_path)
            raise RunLockedError(
                f"{path} is being run by another process ({holder or 'holder unknown'}); "
                "wait for it to end, or end it to take the run over"
            ) from None
        except OSError as exc:
            if exc.errno not in _NO_LOCK_SUPPORT:
                raise
            log.warning("the filesystem of %s does not support file locks (%s); running without the run lock",
                        path, exc.strerror)
            yield
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"host {socket.gethostname()} pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


def is_locked(run_dir: str | os.PathLike) -> bool:
    """Whether a live process holds the lock of `run_dir` now (False when there is no lock file)."""
    lock_path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False
