"""Accuracy of an algorithm on every environment's in and out split."""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from domaingen.algorithms.base import Algorithm
from domaingen.datasets.splits import Split
from domaingen.networks import to_device

EVAL_BATCH_SIZE = 2048


def autocast_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for --precision bf16 (AMX on recent Intel CPUs, or a GPU); a no-op for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def predicted_labels(logits: torch.Tensor) -> torch.Tensor:
    """Class predictions; a single logit column is a binary classifier (logit > 0)."""
    if logits.shape[1] == 1:
        return (logits[:, 0] > 0).long()
    return logits.argmax(dim=1)


def training_domains(n_envs: int, test_envs: Sequence[int]) -> list[int | None]:
    """Per environment, its index among the training environments (the algorithm's domain index); None for a test env."""
    train_envs = [i for i in range(n_envs) if i not in set(test_envs)]
    return [train_envs.index(i) if i in train_envs else None for i in range(n_envs)]


def split_accuracy(
    algorithm: Algorithm,
    split: Split,
    device: torch.device,
    precision: str = "fp32",
    batch_size: int = EVAL_BATCH_SIZE,
    mode: str | None = None,
    domain: int | None = None,
) -> float:
    """Fraction of the split's examples predicted correctly (NaN for an empty split).

    `mode` names one of the algorithm's EVAL_MODES (None: its default `predict`).
    """
    if len(split) == 0:
        return float("nan")
    correct = 0
    for start in range(0, len(split), batch_size):
        x, y = split.batch(slice(start, start + batch_size))
        with autocast_context(device, precision):
            x = to_device(x, device)
            logits = algorithm.predict(x) if mode is None else algorithm.predict_mode(x, mode, domain)
        correct += int((predicted_labels(logits.float()).cpu() == y).sum())
    return correct / len(split)


def evaluate(
    algorithm: Algorithm,
    splits: Sequence[tuple[Split, Split]],
    device: torch.device,
    precision: str = "fp32",
    batch_size: int = EVAL_BATCH_SIZE,
    env_domains: Sequence[int | None] | None = None,
) -> dict[str, float]:
    """{'env{i}_in_acc', 'env{i}_out_acc'} for every environment, in eval mode without autograd.

    For each of the algorithm's EVAL_MODES also 'env{i}_in_acc_{mode}' and
    'env{i}_out_acc_{mode}'; a mode that needs the domain index is reported only
    for the environments whose `env_domains` entry (see `training_domains`) is not None.
    """
    was_training = algorithm.training
    algorithm.eval()
    results: dict[str, float] = {}
    try:
        with torch.inference_mode():
            for i, (split_in, split_out) in enumerate(splits):
                results[f"env{i}_in_acc"] = split_accuracy(algorithm, split_in, device, precision, batch_size)
                results[f"env{i}_out_acc"] = split_accuracy(algorithm, split_out, device, precision, batch_size)
                domain = env_domains[i] if env_domains is not None else None
                for mode, needs_domain in algorithm.EVAL_MODES.items():
                    if needs_domain and domain is None:
                        continue
                    for name, split in (("in", split_in), ("out", split_out)):
                        results[f"env{i}_{name}_acc_{mode}"] = split_accuracy(
                            algorithm, split, device, precision, batch_size, mode, domain
                        )
    finally:
        algorithm.train(was_training)
    return results
