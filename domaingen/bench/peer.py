"""`bench --only peer --peer DIR`: DomainBed's own train.py beside `domaingen train`, on one machine.

DIR is a checkout of DomainBed that the user fetched (never shipped with domaingen):

    git clone https://github.com/facebookresearch/DomainBed DIR

Its dependencies must import in the benchmark's Python (DomainBed's algorithms.py imports
BackPACK, its networks timm): install them, or put them on PYTHONPATH, which the child
processes inherit. Both tools train ColoredMNIST ERM (MNIST_CNN), test environment 2, at
their own defaults (DomainBed evaluates every split at every checkpoint; domaingen its
default `--eval_splits` and precision, or those given), from the same MNIST files, with the
same steps and checkpoints. Each tool runs twice, alternating with the other in child
processes: with checkpoints every `freq` steps (A) and with none between the first and
the last (B). Several domaingen variants (`--peer_args` repeated: the defaults and
`--precision bf16`, say) share one pair of DomainBed runs, each child in turn. Per tool the
table gives the A run's wall time, CPU time (the process and its DataLoader workers) and
peak resident memory of the main process (VmHWM), and the ratios; then a projection to the
published protocol's run (5001 steps, 51 checkpoints):

    rest(R)   = wall(R) - steps x step(R)    what run R spent outside its training steps
    fixed     = rest(B)                      start-up and B's two checkpoints' evaluations
    per check = (rest(A) - rest(B)) / (checkpoints(A) - checkpoints(B))
    full run  = fixed + 5001 x step + 49 x per check

with step(R) the mean training step over run R's records (both tools record it) and `step`
the mean of step(A) and step(B). Subtracting each run's own steps keeps a difference in step
speed between the two runs (a first-step warm-up, a moment of load) out of the evaluation
cost. The same formula serves both tools: DomainBed's checkpoints evaluate every split,
domaingen's what its eval splits plan says (the last checkpoint and a final evaluation are in
`fixed`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from domaingen.errors import DomaingenError

FULL_STEPS, FULL_CHECKPOINTS = 5001, 51
TRAIN_SCRIPT = Path("domainbed") / "scripts" / "train.py"


def check_peer(peer: str | None) -> Path:
    """The DomainBed checkout `peer`, or a one-line DomaingenError saying what is wrong."""
    if not peer:
        raise DomaingenError("--only peer needs --peer DIR, a DomainBed checkout "
                             "(git clone https://github.com/facebookresearch/DomainBed DIR)")
    root = Path(peer).expanduser()
    if not (root / TRAIN_SCRIPT).is_file():
        raise DomaingenError(f"--peer {peer} is not a DomainBed checkout: it has no {TRAIN_SCRIPT} "
                             "(git clone https://github.com/facebookresearch/DomainBed DIR)")
    return root.resolve()


@dataclass
class Timing:
    """One child process: wall and CPU seconds, the main process's peak RSS, the mean step time."""

    wall: float
    cpu: float
    peak_rss_gb: float
    step: float
    checkpoints: int


def _peak_rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def timed_child(command: Sequence[str], env: dict[str, str], cwd: Path, log_path: Path) -> tuple[float, float, float]:
    """Run `command`; returns wall seconds, CPU seconds (with its reaped children) and the main
    process's peak RSS in GB (VmHWM read until it exits; ru_maxrss where /proc is missing)."""
    started = time.perf_counter()
    with open(log_path, "w") as log:
        child = subprocess.Popen(list(command), env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        peak = 0
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, _peak_rss_kb(child.pid) or 0)
            time.sleep(0.1)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        tail = log_path.read_text().strip().splitlines()[-1:] or ["no output"]
        # the message carries the log's last line: the log itself goes with the caller's temporary directory
        raise RuntimeError(f"{command[2] if len(command) > 2 else command[0]} failed: {tail[0]}")
    peak_gb = (peak or usage.ru_maxrss) / 2**20
    return wall, usage.ru_utime + usage.ru_stime, peak_gb


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _mean_step(records: list[dict]) -> float:
    """The mean training step over a run's records (each holds its interval's mean step_time)."""
    steps = [r["step"] for r in records]
    times = [r["step_time"] for r in records]
    counts = [steps[0] + 1] + [b - a for a, b in zip(steps, steps[1:])]
    return sum(t * n for t, n in zip(times, counts)) / sum(counts)


def domainbed_command(peer: Path, data_dir: str, out: Path, steps: int, freq: int) -> list[str]:
    return [sys.executable, "-m", "domainbed.scripts.train", "--data_dir", data_dir, "--dataset", "ColoredMNIST",
            "--algorithm", "ERM", "--test_envs", "2", "--steps", str(steps), "--checkpoint_freq", str(freq),
            "--output_dir", str(out), "--skip_model_save"]


def domaingen_command(data_dir: str, out: Path, steps: int, freq: int, extra: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "domaingen", "-q", "train", "--data_dir", data_dir, "--dataset", "ColoredMNIST",
            "--algorithm", "ERM", "--test_envs", "2", "--steps", str(steps), "--checkpoint_freq", str(freq),
            "--output_dir", str(out), *extra]


def variant_name(extra: Sequence[str]) -> str:
    """How the rows name a domaingen variant: `domaingen`, or `domaingen --precision bf16`."""
    return " ".join(["domaingen", *extra])


def peer_rows(peer: str | None, data_dir: str, steps: int = 101, freq: int = 50,
              variants: Sequence[Sequence[str]] = ((),)) -> list[list]:
    """The rows of `--only peer` (see the module docstring). `variants`: the `domaingen train` flags of each
    domaingen configuration timed against the one DomainBed run (default: domaingen at its defaults), each
    child alternating with DomainBed's, so fp32 and bf16 share one measurement of DomainBed."""
    from domaingen.bench.baseline import header_rows, load_line

    root = check_peer(peer)
    variants = [list(v) for v in variants] or [[]]
    names = [variant_name(v) for v in variants]
    if len(set(names)) != len(names):
        raise DomaingenError(f"--peer_args names one domaingen variant twice: {', '.join(names)}")
    data_dir = str(Path(data_dir).resolve())
    rows = header_rows()  # the load before the children run
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    timings: dict[tuple[str, str], Timing] = {}
    with tempfile.TemporaryDirectory(prefix="domaingen-peer-") as tmp:
        for label, run_freq in (("A", freq), ("B", steps + 1)):
            # alternating: a change of load touches every tool
            for index, tool in enumerate(["DomainBed", *names]):
                out = Path(tmp) / f"{index}-{label}"
                if tool == "DomainBed":
                    command, cwd, run_env = domainbed_command(root, data_dir, out, steps, run_freq), root, env
                else:
                    command = domaingen_command(data_dir, out, steps, run_freq, variants[index - 1])
                    cwd, run_env = Path(tmp), None
                try:
                    wall, cpu, rss = timed_child(command, run_env or dict(os.environ), cwd,
                                                 Path(tmp) / f"{index}-{label}.log")
                except RuntimeError as exc:
                    hint = (" (DomainBed's dependencies, BackPACK and wilds among them, must import in this Python "
                            "or from PYTHONPATH)" if tool == "DomainBed" else "")
                    raise DomaingenError(f"{exc}{hint}") from None
                records = _records(out / "results.jsonl")
                timings[(tool, label)] = Timing(wall, cpu, rss, _mean_step(records), len(records))
    rows.append(["load averages at the end (1, 5, 15 min)", load_line()])
    setting = (f"domaingen train {' '.join(variants[0]) or 'at its defaults'}" if len(variants) == 1
               else "each domaingen variant against the same DomainBed runs")
    rows.append(["peer run", f"ColoredMNIST ERM, test env 2, {steps} steps, a checkpoint every {freq} ({setting})"])
    db, db_b = timings[("DomainBed", "A")], timings[("DomainBed", "B")]
    for name in names:
        dg = timings[(name, "A")]
        rows += [
            [f"wall time: DomainBed / {name}", f"{db.wall:.1f} s / {dg.wall:.1f} s = {db.wall / dg.wall:.2f}x"],
            [f"CPU time: DomainBed / {name}", f"{db.cpu:.1f} s / {dg.cpu:.1f} s = {db.cpu / dg.cpu:.2f}x"],
            [f"peak RSS of the main process: DomainBed / {name}",
             f"{db.peak_rss_gb:.2f} GB / {dg.peak_rss_gb:.2f} GB"],
            [f"mean step: DomainBed / {name}", f"{db.step * 1000:.0f} ms / {dg.step * 1000:.0f} ms"],
            [f"mean step of the B runs: DomainBed / {name}",
             f"{db_b.step * 1000:.0f} ms / {timings[(name, 'B')].step * 1000:.0f} ms"],
        ]
    projected = {}
    for tool in ("DomainBed", *names):
        a, b = timings[(tool, "A")], timings[(tool, "B")]
        rest_a, rest_b = a.wall - steps * a.step, b.wall - steps * b.step
        per_check = (rest_a - rest_b) / max(1, a.checkpoints - b.checkpoints)
        fixed = rest_b
        projected[tool] = fixed + FULL_STEPS * (a.step + b.step) / 2 + (FULL_CHECKPOINTS - 2) * per_check
        rows.append([f"  {tool}: start-up and first/last checkpoints, per further checkpoint",
                     f"{fixed:.1f} s, {per_check:.1f} s"])
    for name in names:
        rows.append([f"full run projection ({FULL_STEPS} steps, {FULL_CHECKPOINTS} checkpoints): DomainBed / {name}",
                     f"{projected['DomainBed'] / 60:.1f} min / {projected[name] / 60:.1f} min = "
                     f"{projected['DomainBed'] / projected[name]:.2f}x"])
    return rows
