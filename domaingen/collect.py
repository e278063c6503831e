"""Read every run directory of a sweep into one pandas DataFrame.

Only runs with a `done` marker count. Output directories written by DomainBed
itself (same results.jsonl field names and `done` marker) are read the same way.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from domaingen.errors import DomaingenError
from domaingen.rundir import DONE, FAILED, RESULTS, read_jsonl

log = logging.getLogger(__name__)

KEY_COLUMNS = ["dataset", "algorithm", "test_envs", "hparams_seed", "trial_seed"]
# Test-time modes an algorithm reports beside its default (Algorithm.EVAL_MODES, fields
# env{i}_{in,out}_acc_{mode}) become table rows named '{algorithm}-{label}'.
MODE_LABELS = {"kd": "KD", "mask_ens": "MaskEns"}
MODE_FIELD = re.compile(r"^env(\d+)_(in|out)_acc_(\w+)$")


@dataclass
class Collection:
    """The records of done runs, plus what was left out and why."""

    records: pd.DataFrame
    failed: list[tuple[str, str]] = field(default_factory=list)  # (run dir, reason)
    incomplete: list[str] = field(default_factory=list)
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per run dir, with its state


def _run_dirs(input_dir: Path) -> list[Path]:
    if (input_dir / RESULTS).exists():
        return [input_dir]
    with os.scandir(input_dir) as entries:
        return sorted(Path(e.path) for e in entries if e.is_dir())


def _flatten(record: dict, run: str) -> dict | None:
    args = record.get("args")
    if not isinstance(args, dict) or "step" not in record:
        return None
    row = {k: v for k, v in record.items() if k not in ("args", "hparams") and not isinstance(v, (dict, list))}
    row["run"] = run
    row["dataset"] = args.get("dataset")
    row["algorithm"] = args.get("algorithm")
    row["test_envs"] = tuple(sorted(args.get("test_envs", ())))
    row["hparams_seed"] = args.get("hparams_seed", 0)
    row["trial_seed"] = args.get("trial_seed", 0)
    row["hparams"] = json.dumps(record.get("hparams", {}), sort_keys=True)
    return row


def _run_row(path: Path, state: str, first: dict | None) -> dict:
    args = (first or {}).get("args") or {}
    if not args and (path / "args.json").exists():
        try:
            args = json.loads((path / "args.json").read_text())
        except json.JSONDecodeError:
            args = {}
    return {
        "run": path.name,
        "state": state,
        "dataset": args.get("dataset"),
        "algorithm": args.get("algorithm"),
        "test_envs": tuple(sorted(args.get("test_envs", ()))),
        "hparams_seed": args.get("hparams_seed"),
        "trial_seed": args.get("trial_seed"),
    }


def collect(input_dir: str | os.PathLike) -> Collection:
    """Every record of every done run under `input_dir` (one level deep, or the dir itself)."""
    root = Path(input_dir)
    if not root.is_dir():
        raise DomaingenError(f"input_dir {root} is not a directory")
    rows: list[dict] = []
    run_rows: list[dict] = []
    failed: list[tuple[str, str]] = []
    incomplete: list[str] = []
    for path in _run_dirs(root):
        if (path / DONE).exists():
            records = read_jsonl(path / RESULTS)
            flat = [r for r in (_flatten(rec, path.name) for rec in records) if r is not None]
            if len(flat) < len(records):
                log.warning("skipping %d records without args or step in %s", len(records) - len(flat), path)
            rows.extend(flat)
            run_rows.append(_run_row(path, "done", records[0] if records else None))
        elif (path / FAILED).exists():
            failed.append((path.name, (path / FAILED).read_text().strip()))
            run_rows.append(_run_row(path, "failed", None))
        elif (path / RESULTS).exists() or (path / "args.json").exists():
            incomplete.append(path.name)
            run_rows.append(_run_row(path, "incomplete", None))
    if not rows:
        raise DomaingenError(
            f"no finished runs in {root} (found {len(failed)} failed, {len(incomplete)} incomplete); "
            "launch or resume the sweep first (domaingen sweep launch)"
        )
    return Collection(pd.DataFrame(rows), failed, incomplete, pd.DataFrame(run_rows))


def expand_modes(records: pd.DataFrame) -> pd.DataFrame:
    """The records plus, per test-time mode found in them, a copy that reads as its own algorithm.

    A copy is named '{algorithm}-{label}' (e.g. DMG-KD), its env{i}_{in,out}_acc are
    the mode's accuracies, NaN where the mode is undefined (KD on a test
    environment), its `run` is '{run}#{mode}', and its `base_algorithm` column
    names the algorithm that ran.
    """
    modes: dict[str, list[tuple[str, str]]] = {}
    for column in records.columns:
        match = MODE_FIELD.match(column)
        if match:
            modes.setdefault(match.group(3), []).append((f"env{match.group(1)}_{match.group(2)}_acc", column))
    parts = [records]
    for mode, columns in sorted(modes.items()):
        has_mode = records[[c for _, c in columns]].notna().any(axis=1)
        if not has_mode.any():
            continue
        copy = records[has_mode].copy()
        base_columns = [c for c in copy.columns if re.fullmatch(r"env\d+_(in|out)_acc", c)]
        copy[base_columns] = float("nan")
        for base, column in columns:
            copy[base] = copy[column]
        copy["base_algorithm"] = copy["algorithm"]
        copy["run"] = copy["run"] + "#" + mode  # selection picks one checkpoint per run name
        copy["algorithm"] = copy["algorithm"] + "-" + MODE_LABELS.get(mode, mode)
        parts.append(copy)
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else records


def n_environments(records: pd.DataFrame, dataset: str) -> int:
    """How many environments a dataset's records report."""
    sub = records[records["dataset"] == dataset]
    n = 0
    while f"env{n}_in_acc" in sub.columns and sub[f"env{n}_in_acc"].notna().any():
        n += 1
    return n
