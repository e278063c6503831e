"""`bench --only allocator`: a full-batch CPU run's step with glibc's default malloc and with freed memory retained.

Each round runs `domaingen train` twice in fresh processes, alternating, on the IRM paper's Colored
MNIST with its MLP (390 wide, 50,000 images a step): once with DOMAINGEN_RETAIN_FREED_MEMORY=0
(glibc's defaults) and once as a run does by default (see domaingen.run.allocator). It reports
the median step time (the records' step_time of the second checkpoint, steps past the first
evaluation), the processes' minor page faults and whether the records are equal.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from domaingen.errors import DomaingenError
from domaingen.run.allocator import ENV
from domaingen.testing import VOLATILE_FIELDS

# the IRM paper's Colored MNIST protocol (sweeps/modreg_grid_irm.toml, part 2)
IRM_PAPER_HPARAMS = {"mlp_width": 390, "l2_weight": 0.0011079, "lr": 0.00048985, "irm_lambda": 91257.18613115903,
                     "irm_penalty_anneal_iters": 190, "penalty_schedule": "irm_paper", "irm_penalty_estimator": "full"}
SETTINGS = {"glibc defaults": "0", "freed memory retained": "1"}


def _run(data_dir: str, out: Path, setting: str, steps: int, threads: int) -> tuple[float, int, list[dict]]:
    """One run in a fresh process: (mean step time of its last checkpoint, minor page faults, stable records)."""
    env = {**os.environ, ENV: setting, "OMP_NUM_THREADS": str(threads)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    done = subprocess.run([sys.executable, "-m", "domaingen", "-q", "train", "--dataset", "IRMColoredMNIST",
                           "--algorithm", "IRM", "--test_envs", "2", "--data_dir", data_dir, "--steps", str(steps),
                           "--checkpoint_freq", str(steps // 2), "--holdout_fraction", "0", "--eval_splits", "final",
                           "--hparams", json.dumps(IRM_PAPER_HPARAMS), "--output_dir", str(out)],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise DomaingenError(f"--only allocator: its IRMColoredMNIST run failed: {said}")
    faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    timed = [r for r in records if r.get("step_time") is not None]
    stable = [{k: v for k, v in r.items() if k not in VOLATILE_FIELDS} for r in records]
    return timed[-1]["step_time"], faults, stable


def bench_allocator(data_dir: str, steps: int = 21, rounds: int = 3, threads: int = 1) -> list[list]:
    """Rows of (measure, value): step time and page faults under each allocator setting, their ratio."""
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    faults: dict[str, list[int]] = {name: [] for name in SETTINGS}
    records: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):
            for name, setting in SETTINGS.items():
                step, n_faults, stable = _run(data_dir, Path(tmp) / f"{setting}_{round_}", setting, steps, threads)
                times[name].append(step)
                faults[name].append(n_faults)
                records[name] = stable
    what = f"IRM, IRMColoredMNIST full batch, {threads} thread(s), {steps} steps"
    rows = [[f"allocator: {name}: step ({what}; median of {rounds})",
             f"{statistics.median(times[name]) * 1000:.0f} ms, {statistics.median(faults[name]) / 1e3:.0f}k page faults a run"]
            for name in SETTINGS]
    default, retained = (statistics.median(times[name]) for name in SETTINGS)
    rows.append(["allocator: retained / default step time", f"{retained / default:.2f}"])
    rows.append(["allocator: records equal", str(records["glibc defaults"] == records["freed memory retained"])])
    return rows
