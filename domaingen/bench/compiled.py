"""`python -m domaingen.bench --only compile`: an eager training step against the same step compiled
(`--compile_step`), on ColoredMNIST-shaped batches (2 x 28 x 28, 64 per environment x 2 environments).

On a CPU the compiled step is inductor's; on a CUDA device both inductor's and the CUDA graphs'
(`cudagraphs`). The eager and compiled models start equal and step on the same batches in
alternation, so a change in the load of a shared machine affects both alike; the figures are medians,
and the ratio of CPU times (which leaves out time stolen by other processes or guests) is printed too.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch

from domaingen.algorithms import ALGORITHMS
from domaingen.datasets import DATASETS
from domaingen.devices import place_model, resolve_device
from domaingen.hparams import draw_hparams, run_space
from domaingen.run.compiled_step import CUDAGRAPHS, INDUCTOR, CompiledUpdate, step_update
from domaingen.run.evaluation import autocast_context

# the featurizers compared: hparams on top of ColoredMNIST's defaults
COMPILE_SETTINGS = {
    "MNIST_CNN": {"featurizer": "MNIST_CNN"},
    "MLP": {"featurizer": "MLP"},  # 3 layers of 256, DomainBed's MNIST MLP
}
PER_ENV = 64


def _model(algorithm: str, extra: dict, device: torch.device):
    dataset = DATASETS.get("ColoredMNIST")
    space = run_space("ColoredMNIST", dataset, ALGORITHMS.get(algorithm))
    hparams = {**draw_hparams(space, "ColoredMNIST", 0), **extra}
    torch.manual_seed(0)
    model = ALGORITHMS.get(algorithm)(dataset.INPUT_SHAPE, 2, 2, hparams)
    return place_model(model, device, dataset.INPUT_SHAPE)


def _batches(device: torch.device, channels_last: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(2):
        x = torch.rand(PER_ENV, 2, 28, 28, generator=g).to(device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        batches.append((x, torch.randint(0, 2, (PER_ENV,), generator=g).to(device)))
    return batches


def compile_modes(device: torch.device) -> list[str]:
    """The compiled steps worth timing on `device`: CUDA graphs only on CUDA."""
    return [INDUCTOR, CUDAGRAPHS] if device.type == "cuda" else [INDUCTOR]


def bench_compiled_step(steps: int, algorithm: str = "ERM", settings: Sequence[str] = tuple(COMPILE_SETTINGS),
                        precision: str = "fp32") -> list[list]:
    """Rows: the eager step, each compiled step (and what compiling cost), and compiled / eager, per setting."""
    device = resolve_device("auto")
    rows = []
    for setting in settings:
        models = {"eager": _model(algorithm, COMPILE_SETTINGS[setting], device)}
        updates = {"eager": models["eager"].update}
        first_step = {}
        for mode in compile_modes(device):
            models[mode] = _model(algorithm, COMPILE_SETTINGS[setting], device)
            updates[mode] = step_update(models[mode].update, models[mode], mode, device)
        batches = _batches(device, getattr(models["eager"], "prefers_channels_last", True))

        def step(name: str) -> tuple[float, float]:
            start, cpu_start = time.perf_counter(), time.process_time()
            with autocast_context(device, precision):
                updates[name](batches)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return time.perf_counter() - start, time.process_time() - cpu_start

        for name in updates:  # compile (the first steps) and warm up: oneDNN picks and caches its kernels
            first_step[name] = step(name)[0]
            for _ in range(3):
                step(name)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in updates}
        for _ in range(steps):
            for name in updates:
                times[name].append(step(name))
        median = {name: statistics.median(wall for wall, _ in t) for name, t in times.items()}
        cpu = {name: statistics.median(c for _, c in t) for name, t in times.items()}
        label = f"{algorithm} step, {setting}, {precision}, {PER_ENV} per env x 2 envs"
        rows.append([f"{label}, eager", f"{median['eager'] * 1000:.2f} ms"])
        for mode in compile_modes(device):
            compiled = isinstance(updates[mode], CompiledUpdate) and updates[mode].compiled is not None
            state = f"first step {first_step[mode]:.1f} s" if compiled else "fell back to eager (see the warning)"
            rows.append([f"{label}, --compile_step {mode}",
                         f"{median[mode] * 1000:.2f} ms ({state})"])
            rows.append([f"{label}, {mode} / eager",
                         f"{median[mode] / median['eager']:.2f}x (CPU time {cpu[mode] / cpu['eager']:.2f}x)"])
    return rows
