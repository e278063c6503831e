"""`bench --only gpu`: issue 52's table measured on one CUDA GPU in about five minutes.

Every figure keeps the issue's definition (ColoredMNIST, test environment 2, ERM, MNIST_CNN):

- one run, 2001 steps and 21 evaluations: wall time and the main process's peak RSS of a
  `domaingen train` child; 501 steps and 6 evaluations in fp32 and bf16 (with `--peer DIR`,
  DomainBed's train.py beside each, through bench.peer);
- one ERM step on 3 x 64 examples, eager and captured (the training loop's `--compile_step
  cudagraphs` wrapper, in this process) in fp32 and bf16, medians of synchronised steps; and one
  `domaingen train --compile_step cudagraphs` child (2 x 64, fp32) whose records' step times after
  the first two intervals give a real run's step, sampling and logging included; a tree without
  that setting says "not available";
- the same step at 8x the batch (3 x 512), eager and captured;
- 1, 4, 8 and 16 processes stepping eagerly on the GPU at once: steps/s of all together;
- N runs stacked with vmap (bench.batching), N = 8 and 32 (out of memory says so);
- evaluation of ColoredMNIST's 70,000 images in batches of 2048 and 8192, fp32 and bf16;
- the 36-job ERM sweep (ColoredMNIST and RotatedMNIST, every test environment, 4 draws,
  501 steps, 6 evaluations), `--launcher parallel --jobs_per_gpu 16`, with its jobs' mean
  start-up (the records' startup_time);
- ERM's step with a ResNet-50 (no weights) on 3 x 32 images of 224 x 224, fp32 and bf16;
- the whole protocol projected in GPU-hours (`protocol_gpu_hours`).

Each timed part is short (a fixed window of seconds, or tens of steps); the rows say so.
The issue's targets are printed beside the figures they concern, met or not met.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from domaingen.errors import DomaingenError

# DomainBed's full MNIST protocol: 3,780 runs of 5001 steps with a checkpoint every 100
PROTOCOL_RUNS, PROTOCOL_STEPS, PROTOCOL_CHECKPOINTS = 3780, 5001, 51
# ColoredMNIST, test environment 2, holdout 0.2, at the default eval splits (final): a checkpoint evaluates
# the two training environments' out splits, the last one every split, the final evaluation the held-out one
CHECKPOINT_IMAGES = 2 * 4666
LAST_CHECKPOINT_IMAGES = 70_000
FINAL_IMAGES = 23_333
SHARED_PROCESSES = (1, 4, 8, 16)
TARGETS = {"step_ms": 1.5, "shared_steps_per_s": 700.0, "sweep_s": 75.0, "protocol_hours": 8.0}
SWEEP_SPEC = """
algorithms = ["ERM"]
datasets = ["ColoredMNIST", "RotatedMNIST"]
n_hparams = 4
n_trials = 1
steps = 501
checkpoint_freq = 100
"""


def check_cuda(available: bool | None = None) -> None:
    """Refuse, in one line, a machine where torch sees no CUDA GPU."""
    import torch

    if not (torch.cuda.is_available() if available is None else available):
        raise DomaingenError("--only gpu measures on a CUDA GPU and torch sees none here "
                             "(torch.cuda.is_available() is False); run it on a machine with one")


def eval_images_per_run(checkpoints: int = PROTOCOL_CHECKPOINTS, per_checkpoint: int = CHECKPOINT_IMAGES,
                        last: int = LAST_CHECKPOINT_IMAGES, final: int = FINAL_IMAGES) -> int:
    """Images one run evaluates: (checkpoints - 1) x per_checkpoint + last + final."""
    return (checkpoints - 1) * per_checkpoint + last + final


def protocol_gpu_hours(steps_per_s: float, eval_images_per_s: float, runs: int = PROTOCOL_RUNS,
                       steps: int = PROTOCOL_STEPS, images: int | None = None) -> float:
    """GPU-hours of the whole protocol on one GPU:

        hours = runs x (steps / steps_per_s + images / eval_images_per_s) / 3600

    with `steps_per_s` the training steps per second the GPU gives all its runs together (the
    processes-sharing figure), `eval_images_per_s` the evaluation throughput and `images` the
    images one run evaluates (`eval_images_per_run()`: 50 x 9,332 + 70,000 + 23,333 = 559,933).
    """
    images = eval_images_per_run() if images is None else images
    return runs * (steps / steps_per_s + images / eval_images_per_s) / 3600


@dataclass
class GpuFigures:
    """What the section measured (None: not measured; a string: why not)."""

    gpu: str = ""
    runs: dict[str, dict[str, float]] = field(default_factory=dict)  # "2001 fp32" -> {wall, rss}; "DomainBed ..." too
    steps_ms: dict[str, float | str] = field(default_factory=dict)  # "eager fp32", "captured bf16", "8x eager fp32"
    shared: dict[int, float] = field(default_factory=dict)  # processes -> steps/s of all together
    shared_seconds: float = 0.0
    vmap: dict[int, float | str] = field(default_factory=dict)  # N -> ms per run-step, or why not
    eval_rate: dict[str, float] = field(default_factory=dict)  # "2048 fp32" -> images/s
    sweep: dict[str, float] = field(default_factory=dict)  # wall, startup_mean, startup_max, jobs
    resnet_ms: dict[str, float] = field(default_factory=dict)  # "fp32", "bf16"
    failures: dict[str, str] = field(default_factory=dict)  # part -> why it failed (the other parts still ran)


def _target(value: float, target: float, at_most: bool = True, unit: str = "") -> str:
    met = value <= target if at_most else value >= target
    return f"(target {'≤' if at_most else '≥'} {target:g}{unit}: {'met' if met else 'not met'})"


def _ms(value: float | str | None) -> str:
    return value if isinstance(value, str) else "not measured" if value is None else f"{value:.2f} ms"


def figure_rows(f: GpuFigures) -> list[list]:
    """The section's [measure, value] rows from its figures, targets beside them."""
    rows: list[list] = [["GPU", f.gpu]]
    for key, label in (("2001 fp32", "one ERM run, MNIST_CNN, 2001 steps and 21 evaluations"),
                       ("501 fp32", "the same, 501 steps and 6 evaluations, fp32"),
                       ("501 bf16", "the same, 501 steps and 6 evaluations, bf16")):
        if key not in f.runs:
            continue
        run = f.runs[key]
        value = f"{run['wall']:.1f} s, {run['rss']:.2f} GB RSS"
        peer = f.runs.get(f"DomainBed {key.split()[0]}")
        if peer:
            value += f"; DomainBed {peer['wall']:.1f} s, {peer['rss']:.2f} GB ({peer['wall'] / run['wall']:.2f}x)"
        rows.append([label, value])
    for key, label in (("eager fp32", "one ERM step, 3 x 64, eager fp32 (median)"),
                       ("eager bf16", "one ERM step, 3 x 64, eager bf16 autocast"),
                       ("captured fp32", "one ERM step, 3 x 64, --compile_step cudagraphs, fp32 (in process)"),
                       ("captured bf16", "one ERM step, 3 x 64, --compile_step cudagraphs, bf16 (in process)"),
                       ("in a run captured fp32", "one step of a --compile_step cudagraphs run, fp32 (2 x 64: "
                                                  "sampling and logging included, run records)"),
                       ("8x eager fp32", "the step at 8x the batch (3 x 512), eager fp32"),
                       ("8x eager bf16", "the step at 8x the batch (3 x 512), eager bf16"),
                       ("8x captured fp32", "the step at 8x the batch (3 x 512), cudagraphs fp32 (in process)"),
                       ("8x captured bf16", "the step at 8x the batch (3 x 512), cudagraphs bf16 (in process)")):
        if key in f.steps_ms:
            rows.append([label, _ms(f.steps_ms[key])])
    numeric = [v for k, v in f.steps_ms.items() if not k.startswith(("8x", "in a run")) and isinstance(v, float)]
    if numeric:
        rows.append(["the fastest MNIST_CNN step above", f"{min(numeric):.2f} ms "
                     + _target(min(numeric), TARGETS["step_ms"], unit=" ms")])
    if f.shared:
        cells = ", ".join(f"{n}: {rate:.0f}" for n, rate in sorted(f.shared.items()))
        best = max(f.shared.values())
        rows.append([f"processes sharing the GPU, eager fp32 steps/s in all ({f.shared_seconds:g} s windows)",
                     f"{cells} " + _target(best, TARGETS["shared_steps_per_s"], at_most=False, unit=" steps/s")])
    for n, value in sorted(f.vmap.items()):
        rows.append([f"{n} runs stacked with vmap, MNIST_CNN, per run-step", _ms(value)])
    if f.eval_rate:
        rows.append(["evaluation, 70,000 images, images/s",
                     ", ".join(f"batch {k}: {v / 1000:.0f}k" for k, v in f.eval_rate.items())])
    if f.sweep:
        s = f.sweep
        rows.append([f"{s['jobs']:.0f}-job ERM sweep (ColoredMNIST and RotatedMNIST, 4 draws, 501 steps, "
                     "6 evaluations), 16 jobs on the GPU",
                     f"{s['wall']:.1f} s " + _target(s["wall"], TARGETS["sweep_s"], unit=" s")])
        rows.append(["  its jobs' start-up to the first step (records' startup_time), mean and max",
                     f"{s['startup_mean']:.2f} s, {s['startup_max']:.2f} s"])
    for precision, ms in f.resnet_ms.items():
        rows.append([f"ResNet-50 step, batch 96 (3 x 32, 224 x 224), {precision}",
                     f"{ms:.1f} ms ({96 / ms * 1000:,.0f} images/s)"])
    rate = max(f.shared.values()) if f.shared else None
    eval_rate = max(f.eval_rate.values()) if f.eval_rate else None
    if rate and eval_rate:
        hours = protocol_gpu_hours(rate, eval_rate)
        rows.append([f"whole protocol ({PROTOCOL_RUNS} runs of {PROTOCOL_STEPS} steps, {eval_images_per_run():,} "
                     "images evaluated each) at the shared rate",
                     f"{hours:.1f} GPU-hours " + _target(hours, TARGETS["protocol_hours"], unit=" GPU-hours")])
    for part, why in f.failures.items():
        rows.append([f"{part}: failed", why])
    for key in ("2001 fp32",):
        peer, own = f.runs.get(f"DomainBed {key.split()[0]}"), f.runs.get(key)
        if peer and own:
            # one run at a time, from the 2001-step run's wall time: the per-step cost with its evaluations
            per_step = peer["wall"] / 2001
            rows.append(["whole protocol, DomainBed, one run at a time (its 2001-step run's seconds per step)",
                         f"{PROTOCOL_RUNS * PROTOCOL_STEPS * per_step / 3600:.0f} GPU-hours"])
    return rows


# --- the measurements (CUDA) -------------------------------------------------------------------------

def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def erm_model(device, per_env: int = 64, n_envs: int = 3):
    """ERM with MNIST_CNN at ColoredMNIST's default hyperparameters, and `n_envs` random minibatches."""
    import torch

    from domaingen.algorithms import ALGORITHMS
    from domaingen.datasets import DATASETS
    from domaingen.devices import place_model
    from domaingen.hparams import draw_hparams, run_space

    cls = DATASETS.get("ColoredMNIST")
    hparams = {**draw_hparams(run_space("ColoredMNIST", cls, ALGORITHMS.get("ERM")), "ColoredMNIST", 0),
               "featurizer": "MNIST_CNN"}
    torch.manual_seed(0)
    model = place_model(ALGORITHMS.get("ERM")(cls.INPUT_SHAPE, 2, n_envs, hparams), device, cls.INPUT_SHAPE)
    batches = [(torch.rand(per_env, *cls.INPUT_SHAPE, device=device), torch.randint(0, 2, (per_env,), device=device))
               for _ in range(n_envs)]
    return model, batches


def step_ms(model, batches, device, precision: str, steps: int = 50, warmup: int = 10,
            update: Callable | None = None) -> float:
    """Median milliseconds of `model.update(batches)` (or of `update(batches)`), each step synchronised."""
    from domaingen.run.evaluation import autocast_context

    update = update or model.update
    times = []
    for i in range(warmup + steps):
        _sync(device)
        start = time.perf_counter()
        with autocast_context(device, precision):
            update(batches)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def has_setting(name: str) -> bool:
    """Whether this tree declares the run setting `name` (a `domaingen train` flag)."""
    from domaingen.run.training import SETTINGS

    return any(item.name == name for item in SETTINGS)


def _run_child(data_dir: str, out: Path, steps: int, freq: int, extra: Sequence[str]) -> tuple[float, float, list]:
    """A `domaingen train` child (ColoredMNIST ERM, test env 2): wall seconds, peak RSS GB, its records."""
    import os

    from domaingen.bench.peer import _records, domaingen_command, timed_child

    command = domaingen_command(data_dir, out, steps, freq, extra)
    wall, _, rss = timed_child(command, dict(os.environ), out.parent, out.parent / f"{out.name}.log")
    return wall, rss, _records(out / "results.jsonl")


def captured_step_ms(data_dir: str, tmp: Path, precision: str, batch_size: int = 64, steps: int = 201,
                     freq: int = 50) -> float | str:
    """The step of a `--compile_step cudagraphs` run: the median of its records' interval step times
    after the first two intervals (capture and warm-up), or why it is not available."""
    if not has_setting("compile_step"):
        return "not available (this tree has no --compile_step setting)"
    out = tmp / f"captured-{precision}-{batch_size}"
    try:
        _, _, records = _run_child(data_dir, out, steps, freq, ["--compile_step", "cudagraphs", "--precision",
                                                                precision, "--hparams",
                                                                json.dumps({"batch_size": batch_size,
                                                                            "featurizer": "MNIST_CNN"})])
    except RuntimeError as exc:
        return f"not available ({exc})"
    steady = [r["step_time"] for r in records[2:]] or [r["step_time"] for r in records[-1:]]
    return statistics.median(steady) * 1000


def captured_inprocess_ms(device, precision: str, per_env: int = 64, mode: str = "cudagraphs") -> float | str:
    """The eager rows' step (ERM, MNIST_CNN, 3 x `per_env` random examples) through the training loop's
    `--compile_step` wrapper, in this process: the median as `step_ms` times it (after 10 warm-up steps,
    capture included), or why it is not available (the wrapper declined or fell back to eager)."""
    from domaingen.run.compiled_step import CompiledUpdate, step_update

    model, batches = erm_model(device, per_env=per_env)
    update = step_update(model.update, model, mode, device)
    if not isinstance(update, CompiledUpdate):
        return f"not available (--compile_step {mode} trains eagerly on {device.type}; see the warning)"
    ms = step_ms(model, batches, device, precision, update=update)
    if update.compiled is None:
        return f"not available (--compile_step {mode} fell back to eager; see the warning)"
    return ms


def _share_worker(rank: int, barrier, results, phases: Sequence[int], seconds: float, device_name: str) -> None:
    import torch

    device = torch.device(device_name)
    model, batches = erm_model(device)
    step_ms(model, batches, device, "fp32", steps=1, warmup=10)
    for n in phases:
        barrier.wait()
        count = 0
        if rank < n:
            _sync(device)
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                model.update(batches)
                count += 1
            _sync(device)
        results.put((n, rank, count))
        barrier.wait()


def shared_rates(phases: Sequence[int] = SHARED_PROCESSES, seconds: float = 4.0, device: str = "cuda"
                 ) -> dict[int, float]:
    """Steps/s of all processes together when n of them step eagerly at once, for each n of `phases`:
    max(phases) processes start once, warm up, then step for `seconds` in each phase (the rest wait)."""
    context = multiprocessing.get_context("spawn")
    n_max = max(phases)
    barrier, results = context.Barrier(n_max), context.Queue()
    workers = [context.Process(target=_share_worker, args=(rank, barrier, results, list(phases), seconds, device))
               for rank in range(n_max)]
    for worker in workers:
        worker.start()
    counts: dict[int, int] = {n: 0 for n in phases}
    received = 0
    try:
        while received < n_max * len(phases):
            try:
                n, _, count = results.get(timeout=1.0)
            except queue.Empty:
                failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
                if failed:
                    raise RuntimeError(f"a process sharing the GPU failed (exit code {failed[0]})") from None
                continue
            counts[n] += count
            received += 1
    finally:
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
    return {n: counts[n] / seconds for n in phases}


def vmap_ms(device, sizes: Sequence[int] = (8, 32)) -> dict[int, float | str]:
    """Milliseconds per run-step of N MNIST_CNN runs stacked with vmap (bench.batching), or 'out of memory'."""
    import torch

    from domaingen.bench.batching import bench_batching

    found: dict[int, float | str] = {}
    for n in sizes:
        try:
            row = bench_batching("MNIST_CNN", (n,), 5, device)[0][1]
            stacked = float(row.split(" / ")[1].split(" ms")[0])
            found[n] = stacked / n
        except torch.cuda.OutOfMemoryError:
            found[n] = "out of memory"
        finally:
            torch.cuda.empty_cache()
    return found


def eval_rates(data_dir: str, device, batches: Sequence[int] = (2048, 8192)) -> dict[str, float]:
    """Images/s of `evaluate` over ColoredMNIST's 70,000 images (every split), per batch size and precision."""
    from domaingen.datasets import DATASETS, split_environments
    from domaingen.run.evaluation import evaluate

    dataset = DATASETS.get("ColoredMNIST")(data_dir, [2], {})
    splits = split_environments(dataset, 0.2, 0)
    n_images = sum(len(a) + len(b) for a, b in splits)
    model, _ = erm_model(device, per_env=1)
    rates = {}
    for batch in batches:
        for precision in ("fp32", "bf16"):
            evaluate(model, splits, device, precision, batch_size=batch)  # warm-up
            _sync(device)
            start = time.perf_counter()
            evaluate(model, splits, device, precision, batch_size=batch)
            _sync(device)
            rates[f"{batch} {precision}"] = n_images / (time.perf_counter() - start)
    return rates


def sweep_figures(data_dir: str, tmp: Path, jobs_per_gpu: int = 16) -> dict[str, float]:
    """The 36-job sweep with `--launcher parallel --jobs_per_gpu 16`: wall seconds (imports included)
    and its jobs' start-up from their records."""
    from domaingen.bench.baseline import sweep_seconds

    spec = tmp / "sweep.toml"
    spec.write_text(SWEEP_SPEC)
    out = tmp / "sweep"
    here = Path(__file__).resolve().parents[2]
    wall, _ = sweep_seconds(here, spec, out, data_dir, ("--launcher", "parallel", "--jobs_per_gpu", str(jobs_per_gpu)))
    startups = [json.loads(path.read_text().splitlines()[0]).get("startup_time")
                for path in out.glob("*/results.jsonl")]
    startups = [s for s in startups if isinstance(s, (int, float))] or [float("nan")]
    return {"wall": wall, "jobs": len(list(out.glob("*/results.jsonl"))), "startup_mean": statistics.mean(startups),
            "startup_max": max(startups)}


def resnet_ms(device, precision: str, steps: int = 10) -> float:
    """ERM's step with a ResNet-50 (no weights, DomainBed's frozen BatchNorm) on 3 x 32 images of 224 x 224."""
    import torch

    from domaingen.algorithms import ALGORITHMS
    from domaingen.datasets.images import PACS
    from domaingen.devices import place_model
    from domaingen.hparams import draw_hparams, run_space

    shape = (3, 224, 224)
    hparams = {**draw_hparams(run_space("PACS", PACS, ALGORITHMS.get("ERM")), "PACS", 0), "backbone": "resnet50",
               "pretrained": False, "batch_size": 32}
    torch.manual_seed(0)
    model = place_model(ALGORITHMS.get("ERM")(shape, 7, 3, hparams), device, shape)
    batches = [(torch.rand(32, *shape, device=device), torch.randint(0, 7, (32,), device=device)) for _ in range(3)]
    if getattr(model, "prefers_channels_last", True):
        batches = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in batches]
    return step_ms(model, batches, device, precision, steps=steps, warmup=3)


def peer_runs(peer: str, data_dir: str, tmp: Path) -> dict[str, dict[str, float]]:
    """DomainBed's train.py for the single-run rows (2001 steps / 21 evaluations, 501 / 6): wall, RSS."""
    import os

    from domaingen.bench.peer import check_peer, domainbed_command, timed_child

    root = check_peer(peer)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    found = {}
    for steps in (2001, 501):
        out = tmp / f"domainbed-{steps}"
        wall, _, rss = timed_child(domainbed_command(root, data_dir, out, steps, 100), env, root,
                                   tmp / f"domainbed-{steps}.log")
        found[f"DomainBed {steps}"] = {"wall": wall, "rss": rss}
    return found


def attempt(figures: GpuFigures, part: str, action: Callable[[], Any], say: Callable[[str], None]) -> None:
    """Run one part of the section; a part that raises is recorded in `figures.failures` (its type and
    message) and the next part runs, so that one failure on a lent GPU does not lose every other figure."""
    say(part)
    started = time.perf_counter()
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - any failure of one part is reported, not raised
        figures.failures[part] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        say(f"{part}: failed ({figures.failures[part]})")
        return
    say(f"{part}: done in {time.perf_counter() - started:.0f} s")


def measure(data_dir: str, peer: str | None = None, progress: Callable[[str], None] | None = None) -> GpuFigures:
    """Every figure of the section on this machine's first CUDA GPU (see the module docstring)."""
    import torch

    check_cuda()
    say = progress or (lambda message: None)
    device = torch.device("cuda")
    data_dir = str(Path(data_dir).resolve())
    figures = GpuFigures(gpu=torch.cuda.get_device_name(0))
    with tempfile.TemporaryDirectory(prefix="domaingen-gpu-") as tmp_name:
        tmp = Path(tmp_name)

        def single_runs() -> None:
            for steps, precision in ((2001, "fp32"), (501, "fp32"), (501, "bf16")):
                wall, rss, _ = _run_child(data_dir, tmp / f"run-{steps}-{precision}", steps, 100,
                                          ["--precision", precision])
                figures.runs[f"{steps} {precision}"] = {"wall": wall, "rss": rss}
                say(f"  {steps} steps {precision}: {wall:.1f} s, {rss:.2f} GB")

        def steps() -> None:
            for scale in (1, 8):
                model, batches = erm_model(device, per_env=64 * scale)
                prefix = "8x " if scale > 1 else ""
                for precision in ("fp32", "bf16"):
                    figures.steps_ms[f"{prefix}eager {precision}"] = step_ms(model, batches, device, precision)
                del model, batches
                for precision in ("fp32", "bf16"):
                    figures.steps_ms[f"{prefix}captured {precision}"] = captured_inprocess_ms(device, precision,
                                                                                              64 * scale)
                say(f"  {figures.steps_ms}")
            figures.steps_ms["in a run captured fp32"] = captured_step_ms(data_dir, tmp, "fp32", 64)
            say(f"  {figures.steps_ms}")

        def shared() -> None:
            figures.shared_seconds = 4.0
            figures.shared = shared_rates(SHARED_PROCESSES, figures.shared_seconds)
            say(f"  {figures.shared}")

        def resnet() -> None:
            for precision in ("fp32", "bf16"):
                figures.resnet_ms[precision] = resnet_ms(device, precision)
            torch.cuda.empty_cache()
            say(f"  {figures.resnet_ms}")

        attempt(figures, "single runs", single_runs, say)
        if peer:
            attempt(figures, "DomainBed's runs", lambda: figures.runs.update(peer_runs(peer, data_dir, tmp)), say)
        attempt(figures, "steps", steps, say)
        attempt(figures, "processes sharing the GPU", shared, say)
        def measured_into(found: dict, produce: Callable[[], dict]) -> Callable[[], None]:
            def action() -> None:
                found.update(produce())
                say(f"  {found}")
            return action

        attempt(figures, "vmap", measured_into(figures.vmap, lambda: vmap_ms(device)), say)
        attempt(figures, "evaluation", measured_into(figures.eval_rate, lambda: eval_rates(data_dir, device)), say)
        attempt(figures, "ResNet-50", resnet, say)
        attempt(figures, "the 36-job sweep", measured_into(figures.sweep, lambda: sweep_figures(data_dir, tmp)), say)
    return figures


def gpu_rows(data_dir: str, peer: str | None = None, progress: Callable[[str], None] | None = None,
             measured: Callable[..., GpuFigures] = measure) -> list[list]:
    """The rows of `--only gpu`: `measured(data_dir, peer, progress)` (tests pass a fake) through `figure_rows`."""
    started = time.perf_counter()
    rows = figure_rows(measured(data_dir, peer, progress))
    rows.append(["the section's own wall time", f"{time.perf_counter() - started:.0f} s"])
    return rows

