"""The files of one run directory, each written so that a crash never leaves a lie.

    args.json       the run's resolved arguments (its identity)
    results.jsonl   one JSON record per checkpoint
    checkpoint.pt   everything needed to resume exactly
    selected.pt     the weights at the checkpoint that training-domain validation selects
                    (selected_{mode}.pt: a test-time mode's, under --eval_splits final)
    final.json      the final evaluation of the held-out splits (run.selected), if any
    log.txt         the run's log
    manifest.json   what it was computed with (run.manifest)
    done | failed   written atomically, last; `failed` holds the reason
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

from domaingen.errors import RunDirectoryError

log = logging.getLogger(__name__)

ARGS, RESULTS, CHECKPOINT, LOG, DONE, FAILED = (
    "args.json",
    "results.jsonl",
    "checkpoint.pt",
    "log.txt",
    "done",
    "failed",
)
SELECTED = "selected.pt"
FINAL = "final.json"

NOT_LAUNCHED, INCOMPLETE, DONE_STATE, FAILED_STATE = "not launched", "incomplete", "done", "failed"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _json_default(value: Any) -> Any:
    if isinstance(value, (tuple, set)):
        return list(value)
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def to_json(obj: Any) -> str:
    """Compact, key-sorted JSON; non-finite floats become null (JSON has no NaN)."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(obj), sort_keys=True, default=_json_default)


def read_jsonl(path: Path, skipped: list[int] | None = None) -> list[dict[str, Any]]:
    """Records of a JSON-lines file; truncated or garbage lines are skipped with a warning (and their
    line numbers appended to `skipped` when given)."""
    records = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            log.warning("skipping unreadable line %d of %s", number, path)
            skipped.append(number) if skipped is not None else None
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            log.warning("skipping line %d of %s: not a JSON object", number, path)
            skipped.append(number) if skipped is not None else None
    return records


class RunDirectory:
    """One run's directory and the rules for reading and writing it."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def file(self, name: str) -> Path:
        return self.path / name

    def state(self) -> str:
        """done, failed, incomplete (started, resumable) or not launched."""
        if self.file(DONE).exists():
            return DONE_STATE
        if self.file(FAILED).exists():
            return FAILED_STATE
        if self.file(ARGS).exists():
            return INCOMPLETE
        return NOT_LAUNCHED

    def read_args(self) -> dict[str, Any] | None:
        """The stored arguments, or None when the directory holds no run yet."""
        if self.path.exists() and not self.path.is_dir():
            raise RunDirectoryError(f"output_dir {self.path} exists and is not a directory; choose another --output_dir")
        try:
            return json.loads(self.file(ARGS).read_text())
        except FileNotFoundError:
            return None
        except NotADirectoryError:  # a parent of the directory is a file
            raise RunDirectoryError(
                f"output_dir {self.path} lies under a file, not a directory; choose another --output_dir"
            ) from None
        except json.JSONDecodeError:
            raise RunDirectoryError(f"{self.file(ARGS)} is not valid JSON; move the directory away or delete it") from None

    def check_identity(self, identity: Mapping[str, Any], keys: Iterable[str]) -> None:
        """Refuse a directory that holds a run with different arguments (never overwrite)."""
        stored = self.read_args()
        if stored is None:
            return
        wanted = json.loads(to_json(dict(identity)))
        differing = [k for k in keys if stored.get(k) != wanted.get(k)]
        if differing:
            detail = "; ".join(f"{k}: {stored.get(k)!r} there, {wanted.get(k)!r} now" for k in differing)
            raise RunDirectoryError(
                f"{self.path} holds a run with different arguments ({detail}); "
                "choose another --output_dir or delete that directory"
            )

    def create(self, args: Mapping[str, Any]) -> None:
        """Make the directory and write args.json (only if it is not there yet)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirectoryError(f"cannot create output_dir {self.path}: {exc.strerror}") from None
        if not os.access(self.path, os.W_OK):
            raise RunDirectoryError(f"output_dir {self.path} is not writable")
        if not self.file(ARGS).exists():
            atomic_write_bytes(self.file(ARGS), (json.dumps(json.loads(to_json(args)), indent=2) + "\n").encode())

    def records(self) -> list[dict[str, Any]]:
        return read_jsonl(self.file(RESULTS))

    def append_record(self, record: Mapping[str, Any]) -> None:
        with open(self.file(RESULTS), "a") as f:
            f.write(to_json(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def keep_records_before(self, step: int) -> None:
        """Drop records of steps >= `step` (written after the checkpoint a resume starts from)."""
        kept = [r for r in self.records() if isinstance(r.get("step"), int) and r["step"] < step]
        atomic_write_bytes(self.file(RESULTS), "".join(to_json(r) + "\n" for r in kept).encode())

    def save_checkpoint(self, state: Mapping[str, Any]) -> None:
        tmp = self.file(CHECKPOINT + ".tmp")
        torch.save(dict(state), tmp)
        os.replace(tmp, self.file(CHECKPOINT))

    def load_checkpoint(self) -> dict[str, Any] | None:
        if not self.file(CHECKPOINT).exists():
            return None
        return torch.load(self.file(CHECKPOINT), map_location="cpu", weights_only=False)

    @staticmethod
    def selected_name(mode: str = "") -> str:
        """selected.pt for the default prediction, selected_{mode}.pt for a test-time mode's."""
        return f"selected_{mode}.pt" if mode else SELECTED

    def save_selected(self, state: Mapping[str, Any], mode: str = "") -> None:
        """Write the selected checkpoint (step, val_acc, model weights) through a temporary file and a rename."""
        path = self.file(self.selected_name(mode))
        tmp = path.with_name(path.name + ".tmp")
        torch.save(dict(state), tmp)
        os.replace(tmp, path)

    def load_selected(self, mode: str = "") -> dict[str, Any] | None:
        """The selected checkpoint, or None when the run has no selected.pt (none written yet, or none kept)."""
        path = self.file(self.selected_name(mode))
        if not path.exists():
            return None
        return torch.load(path, map_location="cpu", weights_only=False)

    def complete_records(self, fills: Mapping[int, Mapping[str, Any]]) -> None:
        """Set the fields `fills[step]` in the record of each such step (rewritten atomically)."""
        if not fills:
            return
        records = [{**r, **fills.get(r.get("step"), {})} for r in self.records()]
        atomic_write_bytes(self.file(RESULTS), "".join(to_json(r) + "\n" for r in records).encode())

    def write_final(self, final: Mapping[str, Any]) -> None:
        """Write final.json (the final evaluation), atomically."""
        atomic_write_bytes(self.file(FINAL), (json.dumps(json.loads(to_json(final)), indent=2) + "\n").encode())

    def mark_done(self, summary: Mapping[str, Any]) -> None:
        self.file(FAILED).unlink(missing_ok=True)
        atomic_write_bytes(self.file(DONE), (to_json(summary) + "\n").encode())

    def mark_failed(self, reason: str) -> None:
        atomic_write_bytes(self.file(FAILED), (reason.rstrip() + "\n").encode())

    def failure_reason(self) -> str | None:
        try:
            return self.file(FAILED).read_text().strip()
        except FileNotFoundError:
            return None

    def clear_failed(self) -> None:
        self.file(FAILED).unlink(missing_ok=True)
