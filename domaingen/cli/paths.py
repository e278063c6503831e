"""Checks of the paths a command writes to, before it starts: one line saying what is wrong with the path."""

from __future__ import annotations

import tempfile
from pathlib import Path

from domaingen.errors import DomaingenError


def _nearest_existing(path: Path) -> Path:
    """`path` itself when it exists, else its closest ancestor that does."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def _check_can_write_in(directory: Path, path: Path, flag: str) -> None:
    """Refuse `path` when `directory`, where it goes, lies under a file or refuses a new file."""
    existing = _nearest_existing(directory)
    if not existing.is_dir():
        raise DomaingenError(f"{flag} {path}: {existing} is a file, not a directory; choose another {flag}")
    try:  # os.access says yes to root even where the file system refuses (read-only mounts, /sys)
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise DomaingenError(f"{flag} {path}: cannot write in {existing} ({exc.strerror}); "
                             f"choose a writable {flag}") from None


def check_output_dir(path: str | Path, flag: str) -> None:
    """Refuse a directory to write into that is a file, lies under a file, or cannot be written."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DomaingenError(f"{flag} {path} is a file, not a directory; choose another {flag}")
    _check_can_write_in(path, path, flag)


def check_output_file(path: str | Path, flag: str) -> None:
    """Refuse a file to write that is a directory, lies under a file, or cannot be written."""
    path = Path(path)
    if path.is_dir():
        raise DomaingenError(f"{flag} {path} is a directory; give a file name")
    _check_can_write_in(path.parent, path, flag)


def check_sweep_dir(path: str | Path, flag: str = "--output_dir") -> None:
    """Refuse a sweep directory to read that is a file."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DomaingenError(f"{flag} {path} is a file, not a sweep directory; give the directory the sweep was "
                             "launched into")
