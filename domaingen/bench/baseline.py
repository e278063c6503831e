"""`make bench` sections that compare this tree with a baseline commit measured in the same run.

`--only fullrun` estimates the published protocol's ColoredMNIST ERM run (MNIST_CNN,
5001 steps, 51 checkpoints) from a few measured steps and one evaluation of each kind
a run makes, per precision, for this tree at its default eval splits and for the
baseline at its own; `--only jobs` times a sweep of short MLP jobs with `--launcher
local` under both. The baseline is exported with `git archive` into a temporary
directory and imported from there in child processes, alternating with this tree's,
so that a change in the load of a shared machine touches both alike.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

PROTOCOL_STEPS, PROTOCOL_FREQ = 5001, 100
MARKER = "domaingen/eval_plan.py"  # the module issue 17 added: the baseline is the commit before it

# Runs in a child process against whichever `domaingen` PYTHONPATH holds: only names the
# baseline has too. Prints one JSON line: step time, evaluation times, the tree's defaults.
PROBE = r"""
import json, statistics, sys, time
import torch
from domaingen.algorithms import ALGORITHMS
from domaingen.datasets import DATASETS, split_environments
from domaingen.hparams import draw_hparams
from domaingen.networks import place_model, resolve_device
import os
import domaingen
# the editable install's finder would serve this module from the current tree: look in the probed one
here = os.path.dirname(domaingen.__file__)
if os.path.isdir(os.path.join(here, "run")):  # the package layout with subpackages
    from domaingen.run.evaluation import autocast_context, evaluate
    from domaingen.run.training import TrainConfig
    try:
        from domaingen.datasets.sampling import MinibatchSampler
    except ImportError:  # a tree whose sampler lives in run.training
        from domaingen.run.training import MinibatchSampler
    from domaingen.run.eval_plan import DEFAULT_EVAL_SPLITS, planned_splits
else:
    from domaingen.evaluation import autocast_context, evaluate
    from domaingen.training import MinibatchSampler, TrainConfig
    if os.path.exists(os.path.join(here, "eval_plan.py")):
        from domaingen.eval_plan import DEFAULT_EVAL_SPLITS, planned_splits
    else:  # a tree from before --eval_splits evaluates every split
        DEFAULT_EVAL_SPLITS, planned_splits = "all", None
cfg = json.loads(sys.argv[1])
precision, steps, threads = cfg["precision"], cfg["steps"], cfg["threads"]
if threads:
    torch.set_num_threads(threads)
device = resolve_device("auto")
dataset = DATASETS.get("ColoredMNIST")(cfg["data_dir"], [2], {})
splits = split_environments(dataset, 0.2, 0)
space = {**DATASETS.get("ColoredMNIST").hparam_space(), **ALGORITHMS.get("ERM").hparam_space()}
hparams = draw_hparams(space, "ColoredMNIST", 0)
torch.manual_seed(0)
model = place_model(ALGORITHMS.get("ERM")(dataset.input_shape, dataset.num_classes, 2, hparams), device,
                    dataset.input_shape)
sampler = MinibatchSampler([s for s, _ in splits[:2]], hparams["batch_size"], 0, device)
# wall time, and the process's CPU time, which a shared machine's other processes disturb far less
times, cpu_times = [], []
for i in range(steps + 3):
    start, cpu_start = time.perf_counter(), time.process_time()
    with autocast_context(device, precision):
        model.update(sampler.next())
    if i >= 3:
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
out = {"file": domaingen.__file__, "step": statistics.median(times), "cpu_step": statistics.median(cpu_times),
       "default_precision": TrainConfig.__dataclass_fields__["precision"].default,
       "default_eval_splits": DEFAULT_EVAL_SPLITS, "threads": torch.get_num_threads()}
start, cpu_start = time.perf_counter(), time.process_time()
evaluate(model, splits, device, precision)
out["full_eval"], out["cpu_full_eval"] = time.perf_counter() - start, time.process_time() - cpu_start
if planned_splits is not None:
    only = planned_splits(PROTOCOL_FREQ, PROTOCOL_STEPS, PROTOCOL_FREQ, 3, [2], DEFAULT_EVAL_SPLITS)
    start, cpu_start = time.perf_counter(), time.process_time()
    evaluate(model, splits, device, precision, only=only)
    out["partial_eval"], out["cpu_partial_eval"] = time.perf_counter() - start, time.process_time() - cpu_start
    try:
        from domaingen.run.eval_plan import evaluated_at_end
    except ImportError:  # a tree from before the final evaluation
        evaluated_at_end = None
    at_end = evaluated_at_end(DEFAULT_EVAL_SPLITS, [2]) if evaluated_at_end else []
    if at_end:
        start, cpu_start = time.perf_counter(), time.process_time()
        evaluate(model, splits, device, precision, only=at_end)
        out["final_eval"], out["cpu_final_eval"] = time.perf_counter() - start, time.process_time() - cpu_start
print(json.dumps(out))
""".replace("PROTOCOL_FREQ", str(PROTOCOL_FREQ)).replace("PROTOCOL_STEPS", str(PROTOCOL_STEPS))


def git(repo: Path, *args: str) -> str:
    """Output of a git command in `repo`, stripped."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def baseline_commit(repo: Path, rev: str = "main") -> str:
    """`rev` as given; for the default, main, the commit before the one that added `--eval_splits`
    (issue 17) where main holds it."""
    if rev != "main":
        return git(repo, "rev-parse", rev)
    added = git(repo, "log", "--diff-filter=A", "--format=%H", "-1", rev, "--", MARKER)
    return git(repo, "rev-parse", f"{added}^" if added else rev)


def export_tree(repo: Path, commit: str, into: Path) -> Path:
    """The `domaingen` package of `commit`, unpacked under `into` (git archive); returns `into`."""
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit, "domaingen"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def probe(tree: Path, data_dir: str, precision: str, steps: int, threads: int | None) -> dict[str, Any]:
    """PROBE's measurements of the `domaingen` under `tree`."""
    config = json.dumps({"data_dir": data_dir, "precision": precision, "steps": steps, "threads": threads})
    done = subprocess.run([sys.executable, "-c", PROBE, config], env=_env(tree), cwd=tree, check=True,
                          capture_output=True, text=True)
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(measured["file"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the probe imported {measured['file']}, not the tree under {tree}")
    return measured


@dataclass
class RunEstimate:
    """A 5001-step run's time from one tree's measurements."""

    step: float
    eval_time: float  # all 51 evaluations
    full_evals: int
    partial_evals: int

    @property
    def total(self) -> float:
        return PROTOCOL_STEPS * self.step + self.eval_time


def estimate(measured: dict[str, Any], clock: str = "") -> RunEstimate:
    """Steps x step time + the evaluations of a run at the tree's default eval splits.

    `clock` "" reads the wall times, "cpu_" the process CPU times.
    """
    n_checkpoints = len(range(0, PROTOCOL_STEPS, PROTOCOL_FREQ)) + ((PROTOCOL_STEPS - 1) % PROTOCOL_FREQ != 0)
    if measured.get("default_eval_splits") in ("selection", "final") and f"{clock}partial_eval" in measured:
        partial, full = n_checkpoints - 1, 1
        # the final evaluation (of the selected checkpoint) counted as if it always ran
        evals = (partial * measured[f"{clock}partial_eval"] + measured[f"{clock}full_eval"]
                 + measured.get(f"{clock}final_eval", 0.0))
    else:
        partial, full = 0, n_checkpoints
        evals = n_checkpoints * measured[f"{clock}full_eval"]
    return RunEstimate(measured[f"{clock}step"], evals, full, partial)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def fullrun_rows(repo: Path, data_dir: str, steps: int, baseline: str = "main", threads: int | None = None,
                 here: Path | None = None) -> list[list]:
    """Per precision: the estimated published-protocol run of this tree beside the baseline's, and their ratio;
    then the same at each tree's defaults."""
    commit = baseline_commit(repo, baseline)
    here = here or Path(__file__).resolve().parents[2]
    rows: list[list] = []
    measured: dict[tuple[str, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="domaingen-baseline-") as tmp:
        old_tree = export_tree(repo, commit, Path(tmp))
        for precision in ("fp32", "bf16"):  # old and new alternate, one child process each
            measured[("baseline", precision)] = probe(old_tree, data_dir, precision, steps, threads)
            measured[("this tree", precision)] = probe(here, data_dir, precision, steps, threads)
    for precision in ("fp32", "bf16"):
        new, old = estimate(measured[("this tree", precision)]), estimate(measured[("baseline", precision)])
        m_new, m_old = measured[("this tree", precision)], measured[("baseline", precision)]
        cpu_new, cpu_old = estimate(m_new, "cpu_"), estimate(m_old, "cpu_")
        rows.append([f"full run estimate, {precision}: this tree ({m_new['default_eval_splits']} eval splits) / "
                     f"baseline {commit[:7]} ({m_old['default_eval_splits']})",
                     f"{_minutes(new.total)} / {_minutes(old.total)} = {new.total / old.total:.0%} "
                     f"(CPU time: {cpu_new.total / cpu_old.total:.0%})"])
        rows.append([f"  {precision}: step, this tree / baseline",
                     f"{m_new['step'] * 1000:.0f} ms / {m_old['step'] * 1000:.0f} ms "
                     f"(CPU time {m_new['cpu_step'] * 1000:.0f} / {m_old['cpu_step'] * 1000:.0f} ms)"])
        evals_new = (f"{new.partial_evals} x {m_new['partial_eval']:.1f} s + " if new.partial_evals else "") + \
            f"{new.full_evals} x {m_new['full_eval']:.1f} s"
        rows.append([f"  {precision}: evaluations, this tree / baseline",
                     f"{evals_new} / {old.full_evals} x {m_old['full_eval']:.1f} s; evaluation "
                     f"{new.eval_time / new.total:.0%} / {old.eval_time / old.total:.0%} of the run; CPU time of a full "
                     f"one {m_new['cpu_full_eval']:.1f} / {m_old['cpu_full_eval']:.1f} s, a partial one "
                     f"{m_new.get('cpu_partial_eval', float('nan')):.1f} s"])
    new_default = measured[("this tree", measured[("this tree", "fp32")]["default_precision"])]
    old_default = measured[("baseline", measured[("baseline", "fp32")]["default_precision"])]
    t_new, t_old = estimate(new_default).total, estimate(old_default).total
    c_new, c_old = estimate(new_default, "cpu_").total, estimate(old_default, "cpu_").total
    rows.append([f"full run at the defaults: this tree ({new_default['default_precision']}, "
                 f"{new_default['default_eval_splits']}) / baseline ({old_default['default_precision']}, "
                 f"{old_default['default_eval_splits']})",
                 f"{_minutes(t_new)} / {_minutes(t_old)} = {t_new / t_old:.0%} (CPU time: {c_new / c_old:.0%})"])
    bf16_new = estimate(measured[("this tree", "bf16")]).total
    bf16_cpu = estimate(measured[("this tree", "bf16")], "cpu_").total
    rows.append(["full run, this tree in bf16 / baseline at its defaults",
                 f"{bf16_new / t_old:.0%} (CPU time: {bf16_cpu / c_old:.0%})"])
    return rows


# the default hyperparameters (a 256-wide MLP, 64 examples per environment) over trials and test
# environments: short jobs as a sweep's first pass runs them; random draws would time their step sizes
JOBS_SPEC = """
algorithms = ["ERM"]
datasets = ["ColoredMNIST"]
test_envs = [[0], [1], [2]]
n_hparams = 1
n_trials = {n_trials}
steps = {steps}

[hparams]
featurizer = "MLP"
"""


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sweep_seconds(tree: Path, spec: Path, out: Path, data_dir: str,
                  launcher: Sequence[str] = ("--launcher", "local")) -> tuple[float, float]:
    """Wall and CPU time of `domaingen sweep launch` (by default `--launcher local`) with the
    `domaingen` under `tree` (imports included)."""
    argv = [sys.executable, "-m", "domaingen", "-q", "sweep", "launch", "--spec", str(spec), "--output_dir", str(out),
            *launcher, "--yes", "--no_progress", "--data_dir", data_dir]
    start, cpu_start = time.perf_counter(), _children_cpu()
    subprocess.run(argv, env=_env(tree), cwd=tree, check=True, capture_output=True)
    return time.perf_counter() - start, _children_cpu() - cpu_start


def recorded_seconds(sweep_dir: Path) -> dict[str, float]:
    """What the runs under `sweep_dir` recorded of their own time: 'steps' (each record's mean
    step_time times the steps it covers), 'evaluations' (eval_time) and 'final' (final.json's seconds)."""
    totals = {"steps": 0.0, "evaluations": 0.0, "final": 0.0}
    for results in sorted(sweep_dir.glob("*/results.jsonl")):
        previous = -1
        for line in results.read_text().splitlines():
            record = json.loads(line)
            totals["steps"] += float(record.get("step_time") or 0.0) * (record["step"] - previous)
            totals["evaluations"] += float(record.get("eval_time") or 0.0)
            previous = record["step"]
        final = results.parent / "final.json"
        if final.exists():
            totals["final"] += float(json.loads(final.read_text()).get("seconds") or 0.0)
    return totals


STARTUP_PROBE = "from domaingen.cli.main import build_parser; build_parser(); import torch._dynamo"


def startup_seconds(tree: Path) -> float:
    """Wall time of a child process that imports domaingen's CLI, builds its parser and imports
    torch._dynamo (which torch's first optimizer imports): what a sweep process pays once."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", STARTUP_PROBE], env=_env(tree), cwd=tree, check=True, capture_output=True)
    return time.perf_counter() - start


def breakdown_rows(wall: float, recorded: dict[str, float], startup: float) -> list[list]:
    """Where a sweep's `wall` seconds went: the runs' recorded steps and evaluations, the process
    start-up, and the rest (per-job set-up and writes), each with its share."""
    rest = wall - sum(recorded.values()) - startup
    parts = [("training steps (the records' step_time)", recorded["steps"]),
             ("checkpoint evaluations (the records' eval_time)", recorded["evaluations"]),
             ("final evaluations of the selected checkpoints (final.json)", recorded["final"]),
             ("process start-up: imports, parser, torch._dynamo (timed apart)", startup),
             ("the rest: per-job set-up (dataset from the cache, model, optimizer, manifest), writes", rest)]
    return [[f"  - {name}", f"{seconds:.1f} s ({seconds / wall:.0%})"] for name, seconds in parts]


def jobs_rows(repo: Path, data_dir: str, n_jobs: int = 24, steps: int = 41, baseline: str = "main",
              here: Path | None = None, repeats: int = 1) -> list[list]:
    """Jobs per hour of a sweep of `n_jobs` ColoredMNIST MLP jobs (ERM at its default hyperparameters, every
    single test environment, n_jobs / 3 trials, `steps` steps, --launcher local), this tree against the
    baseline, alternating baseline and tree `repeats` times in one run; the ratio is of the medians.
    Then where this tree's last sweep spent its time (`breakdown_rows`)."""
    commit = baseline_commit(repo, baseline)
    here = here or Path(__file__).resolve().parents[2]
    n_trials = max(1, n_jobs // 3)
    old, new, cpu_old, cpu_new = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="domaingen-jobs-") as tmp:
        spec = Path(tmp) / "jobs.toml"
        spec.write_text(JOBS_SPEC.format(n_trials=n_trials, steps=steps))
        old_tree = export_tree(repo, commit, Path(tmp) / "baseline")
        for i in range(repeats):
            for tree, walls, cpus, name in ((old_tree, old, cpu_old, "old"), (here, new, cpu_new, "new")):
                wall, cpu = sweep_seconds(tree, spec, Path(tmp) / f"{name}{i}", data_dir)
                walls.append(wall)
                cpus.append(cpu)
        recorded = recorded_seconds(Path(tmp) / f"new{repeats - 1}")
        startup = startup_seconds(here)
    n = 3 * n_trials
    median = statistics.median
    rows = [[f"{n} ColoredMNIST MLP jobs of {steps} steps, --launcher local: this tree / baseline {commit[:7]}"
             + (f" (medians of {repeats}, alternating)" if repeats > 1 else ""),
             f"{median(new):.1f} s / {median(old):.1f} s = {median(new) / median(old):.0%} (CPU time "
             f"{median(cpu_new):.0f} / {median(cpu_old):.0f} s = {median(cpu_new) / median(cpu_old):.0%})"],
            ["  jobs per hour, this tree / baseline", f"{n * 3600 / median(new):.0f} / {n * 3600 / median(old):.0f}"]]
    if repeats > 1:
        rows.append(["  every repeat, this tree / baseline (s)",
                     ", ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(new, old))])
    rows.append([f"  where this tree's last sweep went ({new[-1]:.1f} s)", ""])
    return rows + breakdown_rows(new[-1], recorded, startup)


def gpu_jobs_rows(data_dir: str, n_jobs: int = 24, steps: int = 41, jobs_per_gpu: Sequence[int] = (1, 2, 4),
                  cuda_available: bool | None = None, run_sweep: Any = None) -> list[list]:
    """Issue 29's GPU note: the sweep of `jobs_rows` (this tree only) on the visible CUDA GPUs, once
    with `--launcher local` (one job at a time) and once per K of `jobs_per_gpu` with `--launcher
    parallel --jobs_per_gpu K`: wall time, jobs per hour and the speed-up over local.

    `run_sweep(spec, out, launcher_args) -> (wall, cpu)` replaces `sweep_seconds` (tests)."""
    import torch

    from domaingen.errors import DomaingenError

    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if not available:
        raise DomaingenError("--only gpujobs times sweeps on CUDA GPUs, and torch sees none here "
                             "(torch.cuda.is_available() is False)")
    if not jobs_per_gpu or any(k < 1 for k in jobs_per_gpu):
        raise DomaingenError(f"--jobs_per_gpu takes values of at least 1, got {list(jobs_per_gpu)}")
    here = Path(__file__).resolve().parents[2]
    run_sweep = run_sweep or (lambda spec, out, launcher: sweep_seconds(here, spec, out, data_dir, launcher))
    n_trials = max(1, n_jobs // 3)
    n = 3 * n_trials
    settings = [("--launcher local", ("--launcher", "local"))] + [
        (f"--launcher parallel --jobs_per_gpu {k}", ("--launcher", "parallel", "--jobs_per_gpu", str(k)))
        for k in jobs_per_gpu]
    rows = []
    with tempfile.TemporaryDirectory(prefix="domaingen-gpujobs-") as tmp:
        spec = Path(tmp) / "jobs.toml"
        spec.write_text(JOBS_SPEC.format(n_trials=n_trials, steps=steps))
        local = None
        for i, (label, launcher) in enumerate(settings):
            wall, _ = run_sweep(spec, Path(tmp) / f"sweep{i}", launcher)
            local = wall if local is None else local
            rows.append([f"{n} ColoredMNIST MLP jobs of {steps} steps, {label}",
                         f"{wall:.1f} s, {n * 3600 / wall:.0f} jobs per hour, {local / wall:.2f}x local"])
    return rows


def load_line() -> str:
    """The load averages (1, 5, 15 minutes), to print beside timings taken on a shared machine."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (or platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def header_rows() -> list[list]:
    """CPU, its bf16 support, cores and load: printed first by the comparing sections."""
    from domaingen.run.precision import NATIVE_BF16_CPU_FLAGS, read_cpu_flags

    native = sorted(NATIVE_BF16_CPU_FLAGS & read_cpu_flags())
    return [["CPU", f"{cpu_name()}, {os.cpu_count()} logical CPUs, native bf16: {', '.join(native) or 'no'}"],
            ["load averages at the start (1, 5, 15 min)", load_line()]]


def repo_root(start: Path | None = None) -> Path:
    """The git work tree this package lives in."""
    return Path(git(start or Path(__file__).resolve().parent, "rev-parse", "--show-toplevel"))


def main_rows(section: str, data_dir: str, steps: int, baseline: str, n_jobs: int, repeats: int = 1,
              job_steps: Sequence[int] = (41,)) -> list[list]:
    """The rows of `--only fullrun` or `--only jobs` (`repeats`: alternating sweeps of each, and
    `job_steps`: the steps of each job, a comparison per value; jobs only)."""
    repo = repo_root()
    rows = header_rows()
    if section == "fullrun":
        rows += fullrun_rows(repo, data_dir, steps, baseline)
    else:
        for n_steps in job_steps:
            rows += jobs_rows(repo, data_dir, n_jobs, n_steps, baseline=baseline, repeats=repeats)
    rows.append(["load averages at the end (1, 5, 15 min)", load_line()])
    return rows


__all__: Sequence[str] = ("baseline_commit", "estimate", "fullrun_rows", "gpu_jobs_rows", "jobs_rows", "main_rows",
                          "probe")
