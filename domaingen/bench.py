"""`make bench`: the speed and memory figures the issues ask for (not timed assertions).

Run with DOMAINGEN_DATA pointing at real MNIST: python -m domaingen.bench [--skip_fp32_eval]
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch
from tabulate import tabulate

from domaingen.algorithms import ALGORITHMS
from domaingen.datasets import DATASETS, resolve_data_dir, split_environments
from domaingen.evaluation import autocast_context, evaluate
from domaingen.hparams import draw_hparams
from domaingen.networks import place_model, resolve_device
from domaingen.training import MinibatchSampler, peak_memory_gb


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
    space = {**DATASETS.get("ColoredMNIST").hparam_space(), **ALGORITHMS.get(algorithm).hparam_space()}
    hparams = draw_hparams(space, algorithm, "ColoredMNIST", 0)
    splits = split_environments(dataset, 0.2, 0)
    step_times = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = ALGORITHMS.get(algorithm)(dataset.input_shape, dataset.num_classes, 2, hparams)
        model = place_model(model, device, dataset.input_shape)
        sampler = MinibatchSampler([s_in for s_in, _ in splits[:2]], hparams["batch_size"], 0, device)

        def step() -> None:
            with autocast_context(device, precision):
                model.update(sampler.next())

        timed(step, 3)  # warm-up: oneDNN picks and caches its kernels
        step_times[precision] = timed(step, steps)
        rows.append([f"{algorithm} train step, {precision} (64 per env x 2 envs)",
                     f"{step_times[precision] * 1000:.0f} ms = {1 / step_times[precision]:.2f} steps/s"])
        if precision == "fp32" and skip_fp32_eval:
            continue
        n_images = sum(len(s_in) + len(s_out) for s_in, s_out in splits)
        eval_time = timed(lambda: evaluate(model, splits, device, precision))
        rows.append([f"full evaluation, {precision} ({n_images} images, all splits)", f"{eval_time:.1f} s"])
    rows.append(["bf16 step / fp32 step", f"{step_times['bf16'] / step_times['fp32']:.0%}"])
    rows.append(["peak memory (process RSS, or CUDA allocated)", f"{peak_memory_gb(device):.2f} GB"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--algorithm", default="ERM")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--skip_fp32_eval", action="store_true", help="the fp32 evaluation takes minutes on 2 cores")
    ns = parser.parse_args(argv)
    data_dir = resolve_data_dir(ns.data_dir)
    print(f"device {resolve_device('auto')}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    rows = bench_training(data_dir, ns.algorithm, ns.steps, ns.skip_fp32_eval)
    print(tabulate(rows, headers=["measure", "value"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
