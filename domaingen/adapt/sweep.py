"""Adapt every done run of a sweep, one after another in this process, skipping what is stored.

Runs are adapted in order of their directory names. Each adapter's results on a run
are written whole (adapt.run), so an interrupted command loses at most the adapter
it was in, and the next one resumes there; two commands on one sweep never corrupt a
file, they may only repeat each other's work.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Sequence

from domaingen.adapt.run import adapt_run, adapter_names
from domaingen.errors import DomaingenError
from domaingen.run.rundir import ARGS, DONE

log = logging.getLogger(__name__)


def done_runs(sweep_dir: str | Path) -> list[Path]:
    """The done run directories of a sweep (or the run itself, given one)."""
    root = Path(sweep_dir)
    if not root.is_dir():
        raise DomaingenError(f"--input_dir {root} is not a directory; give a sweep's output directory")
    if (root / ARGS).exists():
        return [root] if (root / DONE).exists() else []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / DONE).exists() and (p / ARGS).exists())


def adapt_sweep(sweep_dir: str | Path, adapters: Sequence[str] | None = None, data_dir: str | None = None,
                device: str = "auto") -> Counter:
    """Adapt every done run of `sweep_dir` with `adapters` (every registered one when None); returns
    how many (adapter, run) pairs ended each way. With `adapters` None an adapter undefined for a run
    (TentFull without BatchNorm) is skipped there; one named explicitly raises its reason."""
    names = adapter_names(adapters)
    runs = done_runs(sweep_dir)
    if not runs:
        raise DomaingenError(f"no done runs in {sweep_dir}; launch or resume the sweep first (domaingen sweep launch)")
    counts: Counter = Counter()
    for i, run in enumerate(runs):
        outcome = adapt_run(run, names, data_dir=data_dir, device=device, skip_undefined=adapters is None)
        for name, what in outcome.items():
            counts[(name, what if what in ("done", "stored already") else f"undefined: {what}")] += 1
        log.info("adapted %d/%d runs (%s)", i + 1, len(runs), run.name)
    return counts
