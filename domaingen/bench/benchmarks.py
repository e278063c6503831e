"""`make bench`: the speed and memory figures the issues ask for (not timed assertions).

Run with DOMAINGEN_DATA pointing at real MNIST: python -m domaingen.bench [--only training|floor|fullrun|jobs|bookkeeping|overhead|images|loader|dmg|report|diagnose|batching|compile|peer --peer DIR|gpujobs --jobs_per_gpu K|gpu [--peer DIR] ...]

`fullrun` and `jobs` compare this tree with a baseline commit (--baseline, default main or,
where main already has issue 17's change, the commit before it) measured in the same run
(see baseline.py); `make bench` runs every section but peer, gpujobs and gpu (issue 52's GPU table, bench.gpu).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from typing import Callable, Sequence

import torch
from torch import nn
from tabulate import tabulate

from domaingen.algorithms import ALGORITHMS
from domaingen.errors import DomaingenError
from domaingen.datasets import DATASETS, resolve_data_dir, split_environments
from domaingen.run.evaluation import ACCELERATOR_EVAL_BATCH_SIZE, CompiledPredict, autocast_context, eval_batch_size, evaluate
from domaingen.hparams import draw_hparams, run_space
from domaingen.devices import place_model, resolve_device, to_device
from domaingen.networks import MNIST_CNN
from domaingen.datasets.sampling import MinibatchSampler
from domaingen.run.training import peak_memory_gb


def cpu_time_counters() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from /proc/stat; None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    return fields[7] if len(fields) > 7 else 0, sum(fields[:8])


def steal_fraction(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Share of CPU time the hypervisor gave to other guests between two `cpu_time_counters` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def timed(fn: Callable[[], object], repeat: int = 1) -> float:
    """Mean wall time of `fn` over `repeat` calls, in seconds."""
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def bench_training(data_dir: str, algorithm: str, steps: int, skip_fp32_eval: bool) -> list[list]:
    """Step time and full-evaluation time of `algorithm` on ColoredMNIST, fp32 and bf16."""
    device = resolve_device("auto")
    rows = []
    build_time = timed(lambda: DATASETS.get("RotatedMNIST")(data_dir, [0], {}))
    rows.append(["RotatedMNIST build (70k rotated)", f"{build_time:.2f} s"])
    start = time.perf_counter()
    dataset = DATASETS.get("ColoredMNIST")(data_dir, [2], {})
    rows.append(["ColoredMNIST build", f"{time.perf_counter() - start:.2f} s"])
    space = run_space("ColoredMNIST", DATASETS.get("ColoredMNIST"), ALGORITHMS.get(algorithm))
    hparams = draw_hparams(space, "ColoredMNIST", 0)
    splits = split_environments(dataset, 0.2, 0)
    n_images = sum(len(s_in) + len(s_out) for s_in, s_out in splits)
    models, steps_of = {}, {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = ALGORITHMS.get(algorithm)(dataset.input_shape, dataset.num_classes, 2, hparams)
        models[precision] = place_model(model, device, dataset.input_shape)
        sampler = MinibatchSampler([s_in for s_in, _ in splits[:2]], hparams["batch_size"], 0, device)

        def step(model=models[precision], sampler=sampler, precision=precision) -> None:
            with autocast_context(device, precision):
                model.update(sampler.next())

        steps_of[precision] = step
    # fp32 and bf16 steps alternate and medians are compared, so a change in the load of a
    # shared machine affects both alike; CPU time leaves out time stolen by other guests.
    wall: dict[str, list[float]] = {p: [] for p in models}
    cpu: dict[str, list[float]] = {p: [] for p in models}
    for i in range(steps + 3):
        for precision, step in steps_of.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            step()
            if i >= 3:  # warm-up: oneDNN picks and caches its kernels
                wall[precision].append(time.perf_counter() - start)
                cpu[precision].append(time.process_time() - cpu_start)
    median = {p: statistics.median(wall[p]) for p in models}
    for precision in models:
        rows.append([f"{algorithm} train step, {precision} (64 per env x 2 envs)",
                     f"{median[precision] * 1000:.0f} ms = {1 / median[precision]:.2f} steps/s"])
    rows.append(["bf16 step / fp32 step",
                 f"{median['bf16'] / median['fp32']:.0%} "
                 f"(CPU time {statistics.median(cpu['bf16']) / statistics.median(cpu['fp32']):.0%})"])
    batch_size = eval_batch_size(device, models["fp32"])
    for precision in ("fp32", "bf16"):
        if precision == "fp32" and skip_fp32_eval:
            continue
        start, cpu_start = time.perf_counter(), time.process_time()
        evaluate(models[precision], splits, device, precision)
        rows.append([f"full evaluation, {precision} ({n_images} images, all splits, batches of {batch_size})",
                     f"{time.perf_counter() - start:.1f} s (CPU time {time.process_time() - cpu_start:.1f} s "
                     f"over {torch.get_num_threads()} threads)"])
    if batch_size != ACCELERATOR_EVAL_BATCH_SIZE:
        start = time.perf_counter()
        evaluate(models["bf16"], splits, device, "bf16", batch_size=ACCELERATOR_EVAL_BATCH_SIZE)
        rows.append([f"full evaluation, bf16, batches of {ACCELERATOR_EVAL_BATCH_SIZE} (the GPU size, for comparison)",
                     f"{time.perf_counter() - start:.1f} s"])
    predict = CompiledPredict(models["bf16"], batch_size)
    start = time.perf_counter()
    evaluate(models["bf16"], splits, device, "bf16", predict=predict)
    first = time.perf_counter() - start
    start = time.perf_counter()
    evaluate(models["bf16"], splits, device, "bf16", predict=predict)
    rows.append([f"full evaluation, bf16, --compile_eval ({n_images} images)",
                 f"{time.perf_counter() - start:.1f} s (first one, compiling: {first:.1f} s)"])
    rows.append(["peak memory (process RSS, or CUDA allocated)", f"{peak_memory_gb(device):.2f} GB"])
    return rows


def bench_convolution_floor(steps: int) -> list[list]:
    """MNIST_CNN with its ReLUs and GroupNorms replaced by Identity: what the convolutions alone cost.

    A lower bound for the full network's evaluation time and the bf16/fp32 step ratio on
    this machine (the data, head and pooling are the same as in `bench_training`).
    """
    device = resolve_device("auto")
    torch.manual_seed(0)
    network = MNIST_CNN((2, 28, 28))
    for i, layer in enumerate(network.layers):
        if not isinstance(layer, nn.Conv2d):
            network.layers[i] = nn.Identity()
    model = nn.Sequential(network, nn.Linear(MNIST_CNN.n_outputs, 2))
    model = place_model(model, device, (2, 28, 28))
    x = torch.rand(8192, 2, 28, 28)
    model.eval()
    batch_size = eval_batch_size(device, model)
    with torch.inference_mode(), autocast_context(device, "bf16"):
        model(to_device(x[:batch_size], device))
        start = time.perf_counter()
        for first in range(0, len(x), batch_size):
            model(to_device(x[first:first + batch_size], device))
        eval_time = (time.perf_counter() - start) * 70_000 / len(x)
    model.train()
    optimizer = torch.optim.Adam(model.parameters())
    batch, labels = to_device(x[:128], device), torch.randint(0, 2, (128,), device=device)
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for i in range(steps + 3):
        for precision in times:
            start = time.perf_counter()
            with autocast_context(device, precision):
                loss = nn.functional.cross_entropy(model(batch).float(), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if i >= 3:
                times[precision].append(time.perf_counter() - start)
    ratio = statistics.median(times["bf16"]) / statistics.median(times["fp32"])
    return [["convolutions only: evaluation of 70000 images, bf16 (lower bound)", f"{eval_time:.1f} s"],
            ["convolutions only: bf16 step / fp32 step (128 images)", f"{ratio:.0%}"]]


# the settings `--only overhead` compares a step in: (dataset, hparams on top of its defaults, examples per env)
PRECISIONS = ("fp32", "bf16")

OVERHEAD_SETTINGS = {
    "MNIST_CNN": ("ColoredMNIST", {"featurizer": "MNIST_CNN"}, 64),
    # the IRM paper's protocol: 392-390-390-1 MLP, full batch, two environments of 25,000
    "IRM-paper MLP, full batch": ("IRMColoredMNIST", {"mlp_width": 390}, 25_000),
}


def _overhead_model(name: str, device: torch.device, setting: str = "MNIST_CNN"):
    dataset, extra, per_env = OVERHEAD_SETTINGS[setting]
    shape = DATASETS.get(dataset).INPUT_SHAPE
    space = run_space(dataset, DATASETS.get(dataset), ALGORITHMS.get(name))
    algorithm_cls = ALGORITHMS.get(name)
    hparams = algorithm_cls.fit_hparams({**draw_hparams(space, dataset, 0), **extra}, 2, set())
    torch.manual_seed(0)
    model = place_model(algorithm_cls(shape, 2, 2, hparams), device, shape)
    batches = [(torch.rand(per_env, *shape, device=device), torch.randint(0, 2, (per_env,), device=device))
               for _ in range(2)]
    if getattr(model, "prefers_channels_last", True):
        batches = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in batches]
    return model, batches


def step_memory_mb(model, batches, device: torch.device, precision: str) -> float:
    """Peak memory one training step allocates on top of what exists before it (torch profiler, CPU).

    On CUDA: the peak of torch.cuda.max_memory_allocated over the step, minus the memory before it.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        with autocast_context(device, precision):
            model.update(batches)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with autocast_context(device, precision):
            model.update(batches)
    running = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        running += event.self_cpu_memory_usage
        peak = max(peak, running)
    return peak / 2**20


def state_memory_mb(model) -> float:
    """Parameters, their gradients and every optimizer's state, in MB."""
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    for optimizer in model.optimizers().values():
        tensors += [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def bench_overhead(algorithm: str, base: str, steps: int, settings: Sequence[str] = tuple(OVERHEAD_SETTINGS),
                   precisions: Sequence[str] = PRECISIONS) -> list[list]:
    """`algorithm`'s train step against `base`'s in each of OVERHEAD_SETTINGS and `precisions`: time and memory.

    MNIST_CNN: 64 per env x 2 envs; the IRM paper's MLP: 25,000 per env x 2 (full batch).
    Steps of the two alternate in one process and the medians are compared, so a
    machine whose load changes affects both alike; the ratio of the processes' CPU
    times is printed too, since it leaves out time stolen by other guests of a shared
    host. Memory: the peak a step allocates plus parameters, gradients and optimizer state.
    """
    device = resolve_device("auto")
    rows = []
    for setting in settings:
        for precision in precisions:
            models = {name: _overhead_model(name, device, setting) for name in (base, algorithm)}
            times: dict[str, list[float]] = {name: [] for name in models}
            cpu_times: dict[str, list[float]] = {name: [] for name in models}
            for i in range(steps + 3):
                for name, (model, batches) in models.items():
                    start, cpu_start = time.perf_counter(), time.process_time()
                    with autocast_context(device, precision):
                        model.update(batches)
                    if i >= 3:  # warm-up: oneDNN picks and caches its kernels
                        times[name].append(time.perf_counter() - start)
                        cpu_times[name].append(time.process_time() - cpu_start)
            memory = {name: step_memory_mb(*models[name], device, precision) + state_memory_mb(models[name][0])
                      for name in models}
            t_base, t_alg = statistics.median(times[base]), statistics.median(times[algorithm])
            rows.append([f"{base} step, {precision}, {setting}", f"{t_base * 1000:.0f} ms, {memory[base]:.0f} MB"])
            rows.append([f"{algorithm} step, {precision}, {setting}", f"{t_alg * 1000:.0f} ms, {memory[algorithm]:.0f} MB"])
            cpu_ratio = statistics.median(cpu_times[algorithm]) / statistics.median(cpu_times[base])
            rows.append([f"{algorithm} / {base}, {precision}, {setting}",
                         f"time {t_alg / t_base:.2f}x (CPU time {cpu_ratio:.2f}x), "
                         f"memory {memory[algorithm] / max(memory[base], 1e-9):.2f}x"])
    return rows


def overhead_algorithms(names: Sequence[str]) -> list[str]:
    """`--overhead` names; `all` stands for every registered algorithm (and ERM+ModReg)."""
    if "all" not in names:
        return list(names)
    every = [n for n in ALGORITHMS.names() if n != "ERM"] + ["ERM+ModReg"]
    return list(dict.fromkeys([n for n in names if n != "all"] + every))


def bench_overhead_table(algorithms: Sequence[str], base: str, steps: int, setting: str = "MNIST_CNN",
                         precisions: Sequence[str] = PRECISIONS) -> list[list]:
    """One row per algorithm: its step time and memory in each of `precisions` as multiples of `base`'s,
    measured as `bench_overhead` measures them (steps alternating with `base`'s, medians)."""
    rows = []
    for algorithm in algorithms:
        cells = bench_overhead(algorithm, base, steps, [setting], precisions)
        ratios = [value for label, value in cells if label.startswith(f"{algorithm} / ")]
        times = [value for label, value in cells if label.startswith(f"{algorithm} step")]
        rows.append([f"{algorithm} / {base}, {setting}",
                     "; ".join(f"{p}: {t.split(',')[0]}, {r}" for p, t, r in zip(precisions, times, ratios))])
    return rows


def bench_dmg(data_dir: str, steps: int, rounds: int = 3) -> list[list]:
    """DMG's train step against ERM's on ColoredMNIST with MNIST_CNN (64 per env x 2 envs), fp32 and bf16,
    and its test-time modes against ERM's predict on one 512-image batch.

    ERM and DMG steps alternate in `rounds` blocks of `steps`, so that both see the same
    load on a shared machine; the ratio is of the summed times.
    """
    device = resolve_device("auto")
    dataset = DATASETS.get("ColoredMNIST")(data_dir, [2], {})
    splits = split_environments(dataset, 0.2, 0)
    train_splits = [s_in for s_in, _ in splits[:2]]
    models = {}
    for name in ("ERM", "DMG"):
        space = run_space("ColoredMNIST", DATASETS.get("ColoredMNIST"), ALGORITHMS.get(name))
        hparams = {**draw_hparams(space, "ColoredMNIST", 0), "featurizer": "MNIST_CNN"}
        torch.manual_seed(0)
        model = place_model(ALGORITHMS.get(name)(dataset.input_shape, dataset.num_classes, 2, hparams), device, dataset.input_shape)
        models[name] = (model, MinibatchSampler(train_splits, hparams["batch_size"], 0, device))
    rows = []
    for precision in ("fp32", "bf16"):
        totals = {name: 0.0 for name in models}
        for name, (model, sampler) in models.items():  # warm-up: oneDNN picks and caches its kernels
            with autocast_context(device, precision):
                timed(lambda: model.update(sampler.next()), 3)
        for _ in range(rounds):
            for name, (model, sampler) in models.items():

                def step(model=model, sampler=sampler) -> None:
                    with autocast_context(device, precision):
                        model.update(sampler.next())
                    if device.type == "cuda":
                        torch.cuda.synchronize()

                totals[name] += timed(step, steps) * steps
        per_step = {name: total / (rounds * steps) for name, total in totals.items()}
        for name in models:
            rows.append([f"{name} train step, MNIST_CNN, {precision} (64 per env x 2 envs)", f"{per_step[name] * 1000:.1f} ms"])
        rows.append([f"DMG step / ERM step, {precision} (target <= 1.3)", f"{per_step['DMG'] / per_step['ERM']:.2f}x"])
    x = splits[0][1].batch(slice(0, 512))[0].to(device)
    if len(dataset.input_shape) == 3:
        x = x.contiguous(memory_format=torch.channels_last)
    erm, dmg = models["ERM"][0].eval(), models["DMG"][0].eval()
    with torch.inference_mode():
        predicts = {
            "ERM predict": lambda: erm.predict(x),
            "DMG Pred-Ens (batch tiled over the 2 domains)": lambda: dmg.predict(x),
            "DMG Pred-Ens as a loop of known-domain passes": lambda: sum(dmg.predict(x, domain=d) for d in range(2)) / 2,
            "DMG Mask-Ens": lambda: dmg.predict(x, mode="mask_ens"),
            "DMG known-domain": lambda: dmg.predict(x, domain=0),
        }
        for name, fn in predicts.items():
            fn()
            rows.append([f"{name}, 512 images, fp32", f"{timed(fn, 3) * 1000:.0f} ms"])
    return rows


def bench_bookkeeping(n_runs: int = 10_000, n_records: int = 10_000) -> list[list]:
    """Sweep bookkeeping on synthetic directories: job list, state scan, collect + tables."""
    import json
    import tempfile
    from pathlib import Path

    from domaingen.tables.collect import collect
    from domaingen.tables.reporting import build_tables, to_markdown
    from domaingen.run.rundir import ARGS, DONE, to_json
    from domaingen.sweep.spec import build_jobs, job_states, parse_spec

    rows = []
    spec = parse_spec({"algorithms": ALGORITHMS.names(), "datasets": ["ColoredMNIST", "RotatedMNIST"],
                       "pairs": True, "n_hparams": 40, "n_trials": 3})
    start = time.perf_counter()
    jobs = build_jobs(spec)
    rows.append([f"build the job list ({len(jobs)} jobs)", f"{time.perf_counter() - start:.2f} s"])
    with tempfile.TemporaryDirectory() as tmp:
        sweep_dir = Path(tmp) / "sweep"
        for i, job in enumerate(jobs[:n_runs]):
            d = job.directory(sweep_dir)
            d.mkdir(parents=True)
            (d / ARGS).write_text(json.dumps(dict(job.args)))
            if i % 3:
                (d / DONE).write_text("{}")
        start = time.perf_counter()
        job_states(jobs[:n_runs], sweep_dir)
        rows.append([f"scan the states of {min(n_runs, len(jobs))} run directories", f"{time.perf_counter() - start:.2f} s"])
    with tempfile.TemporaryDirectory() as tmp:
        per_run = 50
        for r in range(n_records // per_run):
            d = Path(tmp) / f"run{r}"
            d.mkdir()
            args = {"dataset": "ColoredMNIST", "algorithm": ["ERM", "IRM"][r % 2], "test_envs": [r // 2 % 3],
                    "hparams_seed": r // 6 % 10, "trial_seed": r // 60}
            lines = [to_json({"step": 100 * s, "loss": 0.5, **{f"env{i}_{sp}_acc": 0.5 + 0.001 * ((r * 7 + s * 3 + i) % 97)
                     for i in range(3) for sp in ("in", "out")}, "hparams": {"lr": 1e-3}, "args": args}) for s in range(per_run)]
            (d / "results.jsonl").write_text("\n".join(lines) + "\n")
            (d / DONE).write_text("{}")
        start = time.perf_counter()
        collection = collect(tmp)
        loaded = time.perf_counter() - start
        to_markdown(build_tables(collection, ["training", "oracle"]), collection)
        rows.append([f"collect {len(collection.records)} records", f"{loaded:.2f} s"])
        rows.append(["collect + select + tables (training, oracle)", f"{time.perf_counter() - start:.2f} s"])
    return rows


def write_synthetic_sweep(root, n_runs: int = 10_000, records_per_run: int = 11) -> int:
    """A sweep directory of `n_runs` done runs of made-up records (8 algorithms, ColoredMNIST and RotatedMNIST,
    every single test environment, hparams draws and trials), for timing `report`; returns the record count."""
    import json
    from pathlib import Path

    from domaingen.run.rundir import DONE, RESULTS, to_json

    algorithms = ["ERM", "IRM", "VREx", "Fish", "SANDMask", "DMG", "ERM+ModReg", "IRM+ModReg"]
    combos = [(ds, alg, env) for ds, n_envs in (("ColoredMNIST", 3), ("RotatedMNIST", 6))
              for alg in algorithms for env in range(n_envs)]
    n_records = 0
    for r in range(n_runs):
        dataset, algorithm, env = combos[r % len(combos)]
        n_envs = 3 if dataset == "ColoredMNIST" else 6
        hparams_seed, trial = (r // len(combos)) % 47, (r // len(combos)) // 47
        args = {"dataset": dataset, "algorithm": algorithm, "test_envs": [env], "hparams_seed": hparams_seed,
                "trial_seed": trial, "steps": 100 * (records_per_run - 1) + 1}
        run = Path(root) / f"run{r:05d}"
        run.mkdir(parents=True)
        (run / "args.json").write_text(json.dumps(args))
        lines = []
        for s in range(records_per_run):
            record = {"step": 100 * s, "loss": 1.0 / (s + 1), "args": args, "hparams": {"lr": 1e-3},
                      "data_source": "synthetic",
                      **{f"env{i}_{sp}_acc": 0.5 + 0.001 * ((r * 7 + s * 3 + i) % 97) for i in range(n_envs) for sp in ("in", "out")}}
            if algorithm == "DMG":
                record.update(dmg_layer0_iou=0.9 - 0.05 * s, dmg_iou=0.9 - 0.04 * s, penalty=0.5)
            if algorithm.endswith("+ModReg"):
                record.update(modreg_kept_fraction=1 - 0.03 * s, modreg_penalty=0.1)
            lines.append(to_json(record))
        (run / RESULTS).write_text("\n".join(lines) + "\n")
        (run / DONE).write_text("{}")
        n_records += records_per_run
    return n_records


def bench_report(n_runs: int = 10_000, records_per_run: int = 11) -> list[list]:
    """`domaingen report` over a synthetic sweep directory of `n_runs` done runs (figures of selected runs only)."""
    import tempfile
    from pathlib import Path

    from domaingen.inspect.report import build_report

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        n_records = write_synthetic_sweep(Path(tmp) / "sweep", n_runs, records_per_run)
        written = time.perf_counter() - start
        cpu_before = _cpu_seconds()
        start = time.perf_counter()
        report = build_report(Path(tmp) / "sweep", Path(tmp) / "report")
        elapsed = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu_before
    return [[f"write a synthetic sweep directory ({n_runs} runs, {n_records} records)", f"{written:.1f} s"],
            [f"report over it ({len(report.figures)} figures of {len(report.figures) and 'the selected runs'})",
             f"{elapsed:.1f} s wall, {cpu:.1f} s CPU (figure workers included)"]]


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (user + system)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bench_diagnose(data_dir: str) -> list[list]:
    """`diagnose` (no domain masks) of an MNIST_CNN ERM run on ColoredMNIST: reload with its data, then measure."""
    import json
    import tempfile
    from pathlib import Path

    from domaingen.inspect.diagnose import diagnose
    from domaingen.run.reload import load_run
    from domaingen.run.rundir import RunDirectory, to_json
    from domaingen.run.training import TrainConfig, resolve

    run = resolve(TrainConfig(dataset="ColoredMNIST", algorithm="ERM", output_dir="", test_envs=[2], data_dir=data_dir))
    with tempfile.TemporaryDirectory() as tmp:
        rundir = RunDirectory(Path(tmp) / "run")
        rundir.create(run.args)
        torch.manual_seed(0)
        model = run.algorithm_cls((2, 28, 28), 2, 2, run.hparams)  # untrained weights: the cost does not depend on them
        rundir.save_selected({"step": 0, "val_acc": 0.5, "model": model.state_dict()})
        rundir.append_record({"step": 0, "hparams": run.hparams, "args": json.loads(to_json(run.args))})
        cpu_before = _cpu_seconds()
        start = time.perf_counter()
        loaded = load_run(rundir.path, device="cpu")
        loading = time.perf_counter() - start
        result = diagnose(loaded)
        total = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu_before
    neurons = sum(layer["neurons"] for layer in result["layers"].values())
    return [["diagnose MNIST_CNN: reload the model and build ColoredMNIST", f"{loading:.1f} s"],
            [f"diagnose MNIST_CNN, no domain masks, total (3 envs x {result['max_examples']} examples, {neurons} neurons)",
             f"{total:.1f} s wall, {cpu:.1f} s CPU"]]


def write_pacs_shaped_tree(root, per_class: int, size: int = 224) -> int:
    """PACS's layout (4 domains x 7 classes) of smooth random size x size JPEGs; returns the image count."""
    import numpy as np
    from PIL import Image

    from domaingen.datasets.images import PACS

    rng = np.random.default_rng(0)
    count = 0
    for domain in PACS.ENVIRONMENTS:
        for label in ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person"):
            folder = root / "PACS" / domain / label
            folder.mkdir(parents=True)
            for i in range(per_class):
                # low-frequency content compresses and decodes like a photograph, unlike pixel noise
                small = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
                small.resize((size, size), Image.BICUBIC).save(folder / f"{i}.jpg", quality=90)
                count += 1
    return count


def bench_images(workers: int = 2, batches: int = 10, per_class: int = 12) -> list[list]:
    """Images/s of the PACS training loader (3 training domains x 32 images per step) on a generated tree."""
    import tempfile
    from pathlib import Path

    from domaingen.datasets.images import PACS

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        n_files = write_pacs_shaped_tree(Path(tmp), per_class)
        for n_workers in sorted({0, workers}):
            dataset = PACS(tmp, [3], {"num_workers": n_workers, "image_size": 224})
            splits = [s_in for s_in, _ in split_environments(dataset, 0.2, 0)[:3]]
            sampler = dataset.minibatch_sampler(splits, 32, 0, torch.device("cpu"))
            start = time.perf_counter()
            sampler.next()  # starts the workers
            first = time.perf_counter() - start
            per_batch = timed(sampler.next, batches)
            rows.append([f"PACS training loader, {n_workers} workers, 224x224 JPEGs ({n_files} files), 3 x 32 per step",
                         f"{96 / per_batch:.0f} images/s ({per_batch * 1000:.0f} ms/step; first step {first:.2f} s)"])
            del sampler
    return rows


def loader_line(pil_rate: float, cache_rate: float) -> str:
    """The loader section's one printed line."""
    return f"image loader: PIL {pil_rate:.0f} images/s, cache {cache_rate:.0f} images/s = {cache_rate / pil_rate:.2f}x"


def bench_loader(per_class: int = 12, batches: int = 4, rounds: int = 3, workers: int = 0) -> tuple[str, list[list]]:
    """Images/s of the PACS training loader (3 training domains x 32 images per step) on a generated tree of
    224x224 JPEGs, reading the files through PIL and reading the decoded-image cache (built first, not
    timed in the rates) through tensor transforms: (the one line, rows). The two paths alternate for
    `rounds` rounds of `batches` steps each; each rate is from the median round."""
    import tempfile
    from pathlib import Path

    from domaingen.datasets.images import PACS

    with tempfile.TemporaryDirectory() as tmp:
        n_files = write_pacs_shaped_tree(Path(tmp), per_class)
        samplers, build = {}, 0.0
        for path in ("PIL", "cache"):
            dataset = PACS(tmp, [3], {"num_workers": workers, "image_size": 224})
            if path == "cache":
                start = time.perf_counter()
                dataset.use_image_cache(Path(tmp) / "image_cache")
                build = time.perf_counter() - start
            splits = [s_in for s_in, _ in split_environments(dataset, 0.2, 0)[:3]]
            samplers[path] = dataset.minibatch_sampler(splits, 32, 0, torch.device("cpu"))
            samplers[path].next()  # starts the workers
        per_batch = {path: [] for path in samplers}
        for _ in range(rounds):
            for path, sampler in samplers.items():
                per_batch[path].append(timed(sampler.next, batches))
        rates = {path: 96 / statistics.median(times) for path, times in per_batch.items()}
        del samplers
    where = "in the main process" if workers == 0 else f"{workers} workers"
    rows = [[f"image loader, PIL path (decode + PIL transforms), {where}, {n_files} 224x224 JPEGs, 3 x 32 per step",
             f"{rates['PIL']:.0f} images/s"],
            [f"image loader, cache path (memory-mapped uint8 + transforms v2), {where}", f"{rates['cache']:.0f} images/s"],
            ["image loader, cache over PIL", f"{rates['cache'] / rates['PIL']:.2f}x"],
            [f"image cache build ({n_files} images, {workers} workers)", f"{build:.2f} s"]]
    return loader_line(rates["PIL"], rates["cache"]), rows


# small timm models that build offline (pretrained false): a BatchNorm CNN and a ViT
TIMM_BENCH_MODELS = ("resnet10t", "vit_tiny_patch16_224")


def _image_model(name: str, backbone: str, size: int, per_env: int, device: torch.device):
    """`name` on PACS-shaped inputs (3 training domains of `per_env` size x size images, 7 classes)
    with the timm model `backbone` (no weights, BatchNorm statistics updating), and its minibatches."""
    from domaingen.datasets.images import PACS

    shape = (3, size, size)
    space = run_space("PACS", PACS, ALGORITHMS.get(name))
    hparams = {**draw_hparams(space, "PACS", 0), "backbone": f"timm:{backbone}", "pretrained": False,
               "freeze_bn": False, "image_size": size}
    torch.manual_seed(0)
    model = place_model(ALGORITHMS.get(name)(shape, 7, 3, hparams), device, shape)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.rand(per_env, *shape, generator=g).to(device), torch.randint(0, 7, (per_env,), generator=g).to(device))
               for _ in range(3)]
    if getattr(model, "prefers_channels_last", True):
        batches = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in batches]
    return model, batches


def _interleaved_steps(models: dict, steps: int, device: torch.device) -> tuple[dict, dict]:
    """Median wall and process-CPU seconds of each model's `update`, the models' steps alternating
    (after 2 warm-up rounds) so that a change of the machine's load touches all alike."""
    times: dict[str, list[float]] = {name: [] for name in models}
    cpu_times: dict[str, list[float]] = {name: [] for name in models}
    for i in range(steps + 2):
        for name, (model, batches) in models.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start, cpu_start = time.perf_counter(), time.process_time()
            model.update(batches)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 2:
                times[name].append(time.perf_counter() - start)
                cpu_times[name].append(time.process_time() - cpu_start)
    return ({k: statistics.median(v) for k, v in times.items()}, {k: statistics.median(v) for k, v in cpu_times.items()})


def bench_timm_backbones(steps: int, size: int = 64, per_env: int = 8,
                         backbones: Sequence[str] = TIMM_BENCH_MODELS) -> list[list]:
    """ERM's training throughput and memory with small timm backbones (fp32, no weights needed)."""
    device = resolve_device("auto")
    rows = []
    for backbone in backbones:
        model, batches = _image_model("ERM", backbone, size, per_env, device)
        wall, _ = _interleaved_steps({"ERM": (model, batches)}, steps, device)
        memory = step_memory_mb(model, batches, device, "fp32") + state_memory_mb(model)
        n_params = sum(p.numel() for p in model.parameters()) / 1e6
        images = 3 * per_env
        rows.append([f"ERM step, timm:{backbone} ({n_params:.1f} M parameters), {size}x{size}, 3 x {per_env} per step, fp32",
                     f"{images / wall['ERM']:.0f} images/s ({wall['ERM'] * 1000:.0f} ms/step), {memory:.0f} MB"])
    return rows


def bench_averaging(steps: int, backbone: str = "resnet10t", size: int = 64, per_env: int = 8) -> list[list]:
    """The per-step cost of weight averaging: ERM+EMA's and ERM+SWAD's steps against ERM's, and the
    averaging update alone over a ResNet-50's weights with the bytes it moves.

    SWAD's step adds its segment's running mean (one fused lerp over every weight); closing a
    segment (a copy of the weights to the host) happens at checkpoints only, not in this step.
    """
    device = resolve_device("auto")
    rows = []
    models = {name: _image_model(name, backbone, size, per_env, device) for name in ("ERM", "ERM+EMA", "ERM+SWAD")}
    wall, cpu = _interleaved_steps(models, steps, device)
    memory = {name: held_memory_mb(model) for name, (model, _) in models.items()}
    for name in ("ERM+EMA", "ERM+SWAD"):
        model = models[name][0]
        with torch.no_grad():  # the averaging part of the step alone: steadier than a difference of two steps
            alone = statistics.median(timed(lambda: model.accumulate(steps + 2)) for _ in range(5))
        rows.append([f"{name} / ERM step, timm:{backbone}, {size}x{size}, 3 x {per_env} per step, fp32",
                     f"time {wall[name] / wall['ERM']:.3f}x (CPU time {cpu[name] / cpu['ERM']:.3f}x; "
                     f"ERM {wall['ERM'] * 1000:.0f} ms); its averaging alone {alone * 1000:.1f} ms "
                     f"({alone / wall['ERM']:.1%} of ERM's step); memory held {memory[name]:.0f} MB vs {memory['ERM']:.0f} MB"])
    rows += bench_averaging_update(device)
    return rows


def held_memory_mb(model) -> float:
    """What a model holds between steps, in MB: its floating-point state (weights, buffers, weight
    averages), gradients, every optimizer's state, and SWAD's open segment (kept outside the state)."""
    tensors = [t for t in model.state_dict().values() if torch.is_floating_point(t)]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for optimizer in model.optimizers().values():
        tensors += [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    tensors += list((getattr(model, "_segment", None) or {}).values())
    unique = {(t.data_ptr(), t.numel()): t for t in tensors}  # a module under two names (featurizer, network.0) once
    return sum(t.numel() * t.element_size() for t in unique.values()) / 2**20


def bench_averaging_update(device: torch.device, repeat: int = 10) -> list[list]:
    """EMA's update (avg <- avg + (1 - decay)(w - avg), one fused lerp; SWAD's segment mean is the same
    operation) over a ResNet-50's floating-point weights, against a plain copy of as many bytes:
    the update reads two tensors and writes one, so it is bound by memory bandwidth, not arithmetic."""
    import torchvision

    net = torchvision.models.resnet50(weights=None).to(device)
    live = [t.detach() for t in net.state_dict().values() if torch.is_floating_point(t)]
    average = [t.clone() for t in live]
    n_floats = sum(t.numel() for t in live)
    moved = 3 * 4 * n_floats  # read avg, read w, write avg; fp32

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def lerp() -> None:
        torch._foreach_lerp_(average, live, 0.001)
        sync()

    flat_in = torch.empty(n_floats, device=device).uniform_()
    flat_out = torch.empty_like(flat_in)

    def copy() -> None:
        flat_out.copy_(flat_in)
        sync()

    lerp(), copy()  # warm-up
    t_lerp = statistics.median(timed(lerp) for _ in range(repeat))
    t_copy = statistics.median(timed(copy) for _ in range(repeat))
    lerp_rate, copy_rate = moved / t_lerp / 1e9, 2 * 4 * n_floats / t_copy / 1e9
    return [[f"averaging update alone, ResNet-50 weights ({n_floats / 1e6:.1f} M floats, {moved / 1e6:.0f} MB moved), fp32",
             f"{t_lerp * 1000:.1f} ms ({lerp_rate:.1f} GB/s; a plain copy moves {copy_rate:.1f} GB/s: "
             f"{lerp_rate / copy_rate:.0%} of it)"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--algorithm", default="ERM")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--skip_fp32_eval", action="store_true", help="the fp32 evaluation takes minutes on 2 cores")
    parser.add_argument("--only", choices=["training", "floor", "fullrun", "jobs", "bookkeeping", "overhead", "images",
                                           "dmg", "report", "diagnose", "peer", "batching", "gpujobs", "loader", "compile",
                                           "allocator", "gpu"],
                        default=None,
                        help="one section (default: all but peer, gpujobs and gpu)")
    parser.add_argument("--peer", default=None, metavar="DIR",
                        help="peer, gpu: a DomainBed checkout to time beside domaingen (see domaingen.bench.peer)")
    parser.add_argument("--peer_steps", type=int, default=101, help="peer: steps of each run")
    parser.add_argument("--peer_freq", type=int, default=50, help="peer: checkpoint frequency of the A runs")
    parser.add_argument("--peer_args", action="append", default=None, metavar="FLAGS",
                        help="peer: more `domaingen train` flags, e.g. '--precision bf16'; repeat it to time several "
                             "domaingen variants against one DomainBed run ('' is the defaults)")
    parser.add_argument("--baseline", default="main",
                        help="fullrun, jobs: the commit to compare with, as given (default: main, or where main "
                             "already has --eval_splits, the commit before it was added)")
    parser.add_argument("--jobs", type=int, default=24, help="jobs: how many short MLP jobs the compared sweeps run")
    parser.add_argument("--job_steps", type=int, nargs="+", default=[41],
                        help="jobs: the steps of each short job (several: a comparison for each)")
    parser.add_argument("--jobs_per_gpu", type=int, nargs="+", default=[1, 2, 4],
                        help="gpujobs: the jobs sweep with --launcher parallel --jobs_per_gpu K for each K "
                             "(beside --launcher local), on the visible CUDA GPUs")
    parser.add_argument("--repeats", type=int, default=1,
                        help="jobs: sweeps of each tree, alternating; the ratio is of the medians")
    parser.add_argument("--overhead", nargs="+", default=["ERM+ModReg"],
                        help="algorithms whose step is compared with --base (the overhead section); all: every "
                             "registered one, a row each")
    parser.add_argument("--base", default="ERM")
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS),
                        help="overhead, compile: the precisions to step in (bf16 on a CPU without native bf16 is "
                             "emulated and slow: fp32 alone there)")
    parser.add_argument("--overhead_settings", nargs="+", choices=list(OVERHEAD_SETTINGS), default=list(OVERHEAD_SETTINGS),
                        help="overhead: the models and batch sizes to compare the steps in")
    parser.add_argument("--workers", type=int, default=2, help="images: DataLoader workers to measure")
    parser.add_argument("--loader_workers", type=int, default=0,
                        help="loader: DataLoader workers of both paths (0: in the main process, one core each)")
    parser.add_argument("--timm_models", nargs="+", default=list(TIMM_BENCH_MODELS),
                        help="images: timm models whose ERM step is measured (built without weights)")
    parser.add_argument("--averaging_backbone", default="resnet10t",
                        help="images: the timm model ERM, ERM+EMA and ERM+SWAD steps are compared on")
    parser.add_argument("--image_size", type=int, default=64, help="images: the side of the generated images")
    ns = parser.parse_args(argv)
    data_dir = resolve_data_dir(ns.data_dir)
    if ns.only == "peer":
        from domaingen.bench.peer import check_peer, peer_rows

        try:
            check_peer(ns.peer)
            variants = [shlex.split(flags) for flags in (ns.peer_args or [""])]
            rows = peer_rows(ns.peer, data_dir, ns.peer_steps, ns.peer_freq, variants=variants)
        except DomaingenError as exc:
            print(f"domaingen.bench: {exc}", file=sys.stderr)
            return 2
        print(tabulate(rows, headers=["measure", "value"]))
        return 0
    if ns.only == "gpu":
        from domaingen.bench.baseline import header_rows
        from domaingen.bench.gpu import check_cuda, gpu_rows

        try:
            check_cuda()
            if ns.peer:
                from domaingen.bench.peer import check_peer

                check_peer(ns.peer)
            rows = header_rows() + gpu_rows(data_dir, ns.peer,
                                            progress=lambda part: print(f"gpu: {part}", file=sys.stderr, flush=True))
        except DomaingenError as exc:
            print(f"domaingen.bench: {exc}", file=sys.stderr)
            return 2
        print(tabulate(rows, headers=["measure", "value"]))
        return 0
    if ns.only == "gpujobs":
        from domaingen.bench.baseline import gpu_jobs_rows, header_rows

        try:
            rows = header_rows() + gpu_jobs_rows(data_dir, ns.jobs, ns.job_steps[0], ns.jobs_per_gpu)
        except DomaingenError as exc:
            print(f"domaingen.bench: {exc}", file=sys.stderr)
            return 2
        rows.insert(0, ["GPU", torch.cuda.get_device_name(0)])
        print(tabulate(rows, headers=["measure", "value"]))
        return 0
    print(f"device {resolve_device('auto')}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    counters_at_start = cpu_time_counters()
    rows = []
    if ns.only in (None, "bookkeeping"):
        rows += bench_bookkeeping()
    if ns.only in (None, "training"):
        rows += bench_training(data_dir, ns.algorithm, ns.steps, ns.skip_fp32_eval)
    if ns.only in (None, "fullrun"):
        from domaingen.bench.baseline import main_rows

        rows += main_rows("fullrun", data_dir, max(5, ns.steps // 2), ns.baseline, ns.jobs)
    if ns.only in (None, "training", "floor", "fullrun"):
        rows += bench_convolution_floor(max(3, ns.steps // 2))
    if ns.only in (None, "jobs"):
        from domaingen.bench.baseline import main_rows

        rows += main_rows("jobs", data_dir, ns.steps, ns.baseline, ns.jobs, ns.repeats, ns.job_steps)
    if ns.only in (None, "overhead"):
        names = overhead_algorithms(ns.overhead)
        if len(names) > 1:
            for setting in ns.overhead_settings:
                rows += bench_overhead_table(names, ns.base, ns.steps, setting, ns.precisions)
        else:
            rows += bench_overhead(names[0], ns.base, ns.steps, ns.overhead_settings, ns.precisions)
    if ns.only in (None, "images"):
        rows += bench_images(ns.workers)
        rows += bench_timm_backbones(max(3, ns.steps // 4), ns.image_size, backbones=ns.timm_models)
        rows += bench_averaging(max(3, ns.steps // 4), ns.averaging_backbone, ns.image_size)
    if ns.only in (None, "loader"):
        line, loader_rows = bench_loader(workers=ns.loader_workers)
        print(line)
        rows += loader_rows
    if ns.only in (None, "dmg"):
        rows += bench_dmg(data_dir, max(1, ns.steps // 2))
    if ns.only in (None, "report"):
        rows += bench_report()
    if ns.only in (None, "diagnose"):
        rows += bench_diagnose(data_dir)
    if ns.only in (None, "compile"):
        from domaingen.bench.compiled import bench_compiled_step

        for precision in ns.precisions:
            rows += bench_compiled_step(ns.steps, ns.algorithm, precision=precision)
    if ns.only in (None, "batching"):
        from domaingen.bench.batching import bench_batching

        for model in ("MLP", "MNIST_CNN"):
            rows += bench_batching(model, (1, 4, 8) if model == "MLP" else (1, 4), 15 if model == "MLP" else 5)
    if ns.only in (None, "allocator"):
        from domaingen.bench.allocator import bench_allocator

        try:
            rows += bench_allocator(data_dir)
        except DomaingenError as exc:
            print(f"domaingen.bench: {exc}", file=sys.stderr)
            return 2
    steal = steal_fraction(counters_at_start, cpu_time_counters())
    if steal is not None:
        # On a shared virtual machine the wall times above include the time other guests held the CPUs.
        rows.append(["CPU steal during the benchmark (other guests of the host)", f"{steal:.0%}"])
    print(tabulate(rows, headers=["measure", "value"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
