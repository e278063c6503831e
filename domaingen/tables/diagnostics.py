"""The runs' diagnostics.json behind a collection, read alike from a sweep, a run or a records bundle.

`domaingen evaluate` and `domaingen diagnose` write their measurements to RUN/diagnostics.json;
`domaingen export` keeps that file in a bundle's runs/RUN/. The views that tabulate those
measurements (`collect masks-x-domains`, `collect domain-masks`) open the folder the
collection's `run` column is relative to with `runs_directory` and read each run's file with
`run_diagnostics`.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from domaingen.run.rundir import RESULTS
from domaingen.tables.export import DIAGNOSTICS, RUNS, is_bundle, open_bundle


@contextmanager
def runs_directory(input_dir: str | os.PathLike) -> Iterator[Path]:
    """The folder whose subfolders the collection's `run` column names: a bundle's runs/ folder (a zip's
    extracted for the duration), else `input_dir` itself (a sweep directory, or one run directory)."""
    if is_bundle(input_dir):
        with open_bundle(input_dir) as bundle:
            yield bundle.root / RUNS
    else:
        yield Path(input_dir)


def run_diagnostics(root: str | os.PathLike, run: str) -> dict[str, Any] | None:
    """Run `run`'s diagnostics.json under `root` (`root` itself when it is one run's directory), or None when
    it has none or the file is unreadable."""
    root = Path(root)
    path = (root if (root / RESULTS).exists() else root / run) / DIAGNOSTICS
    if not path.exists():
        return None
    try:
        content = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return content if isinstance(content, dict) else None
