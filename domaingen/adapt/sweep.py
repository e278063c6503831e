"""Adapt every done run of a sweep, skipping what is stored: one after another in this process, or
`workers` runs at once in child processes (one thread each unless `threads` says otherwise).

Runs are adapted in order of their directory names. Each adapter's results on a run
are written whole (adapt.run), so an interrupted command loses at most the adapter
it was in, and the next one resumes there; two commands on one sweep never corrupt a
file, they may only repeat each other's work.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
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


def _adapt_one(run: Path, names: Sequence[str], data_dir: str | None, device: str, skip_undefined: bool,
               threads: int | None) -> dict[str, str]:
    """One run's adaptation (a worker process's task)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    return adapt_run(run, names, data_dir=data_dir, device=device, skip_undefined=skip_undefined)


def adapt_sweep(sweep_dir: str | Path, adapters: Sequence[str] | None = None, data_dir: str | None = None,
                device: str = "auto", workers: int = 1, threads: int | None = None) -> Counter:
    """Adapt every done run of `sweep_dir` with `adapters` (every registered one when None); returns
    how many (adapter, run) pairs ended each way. With `adapters` None an adapter undefined for a run
    (TentFull without BatchNorm) is skipped there; one named explicitly raises its reason.
    `workers` > 1 adapts that many runs at once in spawned processes, each with `threads` threads
    (default: the CPUs shared out among the workers)."""
    if workers < 1:
        raise DomaingenError(f"--workers must be at least 1, got {workers}")
    names = adapter_names(adapters)
    runs = done_runs(sweep_dir)
    if not runs:
        raise DomaingenError(f"no done runs in {sweep_dir}; launch or resume the sweep first (domaingen sweep launch)")
    counts: Counter = Counter()
    skip = adapters is None

    def tally(i: int, run: Path, outcome: dict[str, str]) -> None:
        for name, what in outcome.items():
            counts[(name, what if what in ("done", "stored already") else f"undefined: {what}")] += 1
        log.info("adapted %d/%d runs (%s)", i + 1, len(runs), run.name)

    if workers == 1:
        for i, run in enumerate(runs):
            tally(i, run, adapt_run(run, names, data_dir=data_dir, device=device, skip_undefined=skip))
        return counts
    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(_adapt_one, run, names, data_dir, device, skip, threads) for run in runs]
        for i, (run, future) in enumerate(zip(runs, futures)):
            tally(i, run, future.result())
    return counts
