"""Accuracy of an algorithm on every environment's in and out split (plus a dataset's own metrics)."""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, Collection, Iterable, Mapping, Sequence

import torch
from torch import nn

from domaingen.algorithms.base import Algorithm
from domaingen.datasets.base import MultiDomainDataset
from domaingen.datasets.splits import Split
from domaingen.devices import has_convolutions, to_device

CPU_EVAL_BATCH_SIZE = 128
CPU_DENSE_EVAL_BATCH_SIZE = 1024
ACCELERATOR_EVAL_BATCH_SIZE = 2048

log = logging.getLogger(__name__)

Predict = Callable[[torch.Tensor], torch.Tensor]


def autocast_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for --precision bf16 (AMX on recent Intel CPUs, or a GPU); a no-op for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def eval_batch_size(device: torch.device, model: nn.Module | None = None) -> int:
    """Evaluation batch size for `device` (and `model`): large on a GPU, cache-sized on a CPU.

    On a CPU a batch whose activations fit in the last-level cache (MNIST_CNN at 128
    images: about 6 MB per layer in bf16) evaluates faster than a large one whose
    activations stream through memory: a full ColoredMNIST evaluation took 17 s at 128
    against 25 s at 2048 on a 2-core AMD EPYC (bf16). A network without convolutions
    (an MLP) has no such activations, its largest tensor is the input batch (1024
    ColoredMNIST images: 6.4 MB in fp32), so it evaluates in batches of 1024: fewer
    batches to slice, convert and dispatch. Predictions do not depend on the size.
    """
    fixed = getattr(model, "EVAL_BATCH_SIZE", None)
    if fixed:  # the method's predictions depend on the batch: its own size everywhere
        return int(fixed)
    if device.type != "cpu":
        return ACCELERATOR_EVAL_BATCH_SIZE
    if model is not None and not has_convolutions(model):
        return CPU_DENSE_EVAL_BATCH_SIZE
    return CPU_EVAL_BATCH_SIZE


class CompiledPredict:
    """`algorithm.predict` through torch.compile, for evaluation (`--compile_eval`).

    Inductor fuses the memory-bound layers (ReLU, GroupNorm) that cost a CPU as much as
    the convolutions. Every batch is padded to `batch_size` rows, so one compiled graph
    serves a whole evaluation: a shorter last batch would otherwise compile again for
    each new length. If compilation fails (no C++ compiler, a backend torch cannot
    compile for), one warning is logged and evaluation goes on eagerly.
    """

    def __init__(self, algorithm: Algorithm, batch_size: int) -> None:
        self.algorithm = algorithm
        self.batch_size = batch_size
        self.compiled: Predict | None = torch.compile(algorithm.predict, dynamic=False)
        if getattr(algorithm, "EVAL_BATCH_SIZE", None):
            # padding the last batch would change a batch-dependent prediction
            log.warning("%s predicts from whole batches; --compile_eval is ignored for it", type(algorithm).__name__)
            self.compiled = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.compiled is None:
            return self.algorithm.predict(x)
        if x.shape[0] > self.batch_size:
            return torch.cat([self(part) for part in x.split(self.batch_size)])
        n = x.shape[0]
        if n < self.batch_size:
            padding = x[:1].expand(self.batch_size - n, *x.shape[1:])
            channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
            x = torch.cat([x, padding])
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
        try:
            return self.compiled(x)[:n]
        except Exception as exc:  # any compiler failure; a genuine error recurs in the eager call below
            log.warning("torch.compile failed for evaluation (%s: %s); evaluating without it",
                        type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            self.compiled = None
            return self.algorithm.predict(x[:n])


def predicted_labels(logits: torch.Tensor) -> torch.Tensor:
    """Class predictions; a single logit column is a binary classifier (logit > 0)."""
    if logits.shape[1] == 1:
        return (logits[:, 0] > 0).long()
    return logits.argmax(dim=1)


def training_domains(n_envs: int, test_envs: Sequence[int]) -> list[int | None]:
    """Per environment, its index among the training environments (the algorithm's domain index); None for a test env."""
    train_envs = [i for i in range(n_envs) if i not in set(test_envs)]
    return [train_envs.index(i) if i in train_envs else None for i in range(n_envs)]


def split_predictions(
    algorithm: Algorithm,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    precision: str = "fp32",
    mode: str | None = None,
    domain: int | None = None,
    predict: Predict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(predicted labels, true labels) over `batches`, on the CPU.

    `mode` names one of the algorithm's EVAL_MODES (None: its default `predict`, or
    `predict` when given, e.g. a `CompiledPredict`).
    """
    predicted, labels = split_mode_predictions(algorithm, batches, device, precision, [mode], domain, predict)
    return predicted[0], labels


def split_mode_predictions(
    algorithm: Algorithm,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    precision: str = "fp32",
    modes: Sequence[str | None] = (None,),
    domain: int | None = None,
    predict: Predict | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """([predicted labels per mode], true labels) over `batches`, on the CPU, reading each batch
    once for every mode (`Algorithm.predict_modes`; None: the default prediction, or `predict`
    when given, e.g. a `CompiledPredict`)."""
    predicted: list[list[torch.Tensor]] = [[] for _ in modes]
    labels = []
    channels_last = has_convolutions(algorithm)
    for x, y in batches:
        with autocast_context(device, precision):
            x = to_device(x, device, channels_last)
            if predict is None and hasattr(algorithm, "predict_modes"):
                logits = algorithm.predict_modes(x, modes, domain)
            else:  # a compiled default prediction, or a model with only predict (and predict_mode)
                default = predict or algorithm.predict
                logits = [default(x) if mode is None else algorithm.predict_mode(x, mode, domain) for mode in modes]
        for kept, mode_logits in zip(predicted, logits):
            kept.append(predicted_labels(mode_logits.float()).cpu())
        labels.append(y.cpu())
    if not labels:
        return [torch.zeros(0, dtype=torch.long) for _ in modes], torch.zeros(0, dtype=torch.long)
    return [torch.cat(kept) for kept in predicted], torch.cat(labels)


def _slices(split: Split, batch_size: int) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    for start in range(0, len(split), batch_size):
        yield split.batch(slice(start, start + batch_size))


def split_accuracy(
    algorithm: Algorithm,
    split: Split,
    device: torch.device,
    precision: str = "fp32",
    batch_size: int | None = None,
    mode: str | None = None,
    domain: int | None = None,
) -> float:
    """Fraction of the split's examples predicted correctly (NaN for an empty split).

    `batch_size` None: `eval_batch_size(device, algorithm)`.
    """
    if len(split) == 0:
        return float("nan")
    batch_size = batch_size or eval_batch_size(device, algorithm)
    predicted, labels = split_predictions(algorithm, _slices(split, batch_size), device, precision, mode, domain)
    return int((predicted == labels).sum()) / len(split)


def evaluate(
    algorithm: Algorithm,
    splits: Sequence[tuple[Split, Split]],
    device: torch.device,
    precision: str = "fp32",
    batch_size: int | None = None,
    dataset: MultiDomainDataset | None = None,
    env_domains: Sequence[int | None] | None = None,
    predict: Predict | None = None,
    only: Collection[str] | None = None,
    extra: Mapping[str, Sequence[Split | None]] | None = None,
) -> dict[str, float]:
    """{'env{i}_in_acc', 'env{i}_out_acc'} for every environment, in eval mode without autograd.

    `only` names the splits to evaluate ('env{i}_in', 'env{i}_out'; see eval_plan);
    None evaluates every split. A split left out gets no fields, and a dataset's
    `environment_metrics` (over an environment's in and out splits together) is
    computed only for environments whose both splits are evaluated.

    With `dataset`, its `eval_batches` feeds the examples (image datasets use their
    DataLoader workers) and its `environment_metrics` adds its own fields. For each of
    the algorithm's EVAL_MODES also 'env{i}_in_acc_{mode}' and 'env{i}_out_acc_{mode}';
    a mode that needs the domain index is reported only for the environments whose
    `env_domains` entry (see `training_domains`) is not None. `predict` replaces
    `algorithm.predict` for the default mode (see `CompiledPredict`). `batch_size` None:
    `eval_batch_size(device, algorithm)`.

    `extra` adds splits of other kinds, kind -> one Split (or None) per environment, as
    fields 'env{i}_{kind}_acc' (and per mode): the in-domain test splits, {'idtest': ...}.
    """
    batch_size = batch_size or eval_batch_size(device, algorithm)
    was_training = algorithm.training
    algorithm.eval()
    results: dict[str, float] = {}
    try:
        with torch.inference_mode():
            for i, (split_in, split_out) in enumerate(splits):
                domain = env_domains[i] if env_domains is not None else None
                modes = [(None, "")] + [
                    (mode, f"_{mode}") for mode, needs_domain in algorithm.EVAL_MODES.items()
                    if domain is not None or not needs_domain
                ]
                kinds = [("in", split_in), ("out", split_out)]
                kinds += [(kind, per_env[i]) for kind, per_env in (extra or {}).items() if per_env[i] is not None]
                wanted = [(name, split) for name, split in kinds if only is None or f"env{i}_{name}" in only]
                # every mode of a batch at once: each split is read (decoded, for images) once
                per_split = []
                for name, split in wanted:
                    batches = dataset.eval_batches(split, batch_size) if dataset is not None else _slices(split, batch_size)
                    per_split.append(split_mode_predictions(algorithm, batches, device, precision,
                                                            [mode for mode, _ in modes], domain, predict))
                for m, (mode, suffix) in enumerate(modes):
                    for (name, split), (preds, labels) in zip(wanted, per_split):
                        accuracy = int((preds[m] == labels).sum()) / len(split) if len(split) else float("nan")
                        results[f"env{i}_{name}_acc{suffix}"] = accuracy
                    if dataset is not None and mode is None and [n for n, _ in wanted[:2]] == ["in", "out"]:
                        index = torch.cat([split_in.index, split_out.index])
                        default = [preds[0] for preds, _ in per_split[:2]]
                        results.update(dataset.environment_metrics(i, index, torch.cat(default)))
    finally:
        algorithm.train(was_training)
    return results


def validation_loss(
    algorithm: Algorithm,
    splits: Sequence[tuple[Split, Split]],
    test_envs: Collection[int],
    device: torch.device,
    precision: str = "fp32",
    dataset: MultiDomainDataset | None = None,
    batch_size: int | None = None,
) -> float:
    """The training-domain validation loss: the mean over training environments of the mean
    cross-entropy of each `out` split (SWAD's `tr_outloss`), in eval mode without autograd."""
    from domaingen.algorithms.base import classification_loss

    batch_size = batch_size or eval_batch_size(device, algorithm)
    was_training = algorithm.training
    algorithm.eval()
    losses = []
    try:
        with torch.inference_mode():
            for i, (_, split_out) in enumerate(splits):
                if i in test_envs or len(split_out) == 0:
                    continue
                batches = dataset.eval_batches(split_out, batch_size) if dataset is not None else _slices(split_out, batch_size)
                total = 0.0
                for x, y in batches:
                    with autocast_context(device, precision):
                        logits = algorithm.predict(to_device(x, device, has_convolutions(algorithm)))
                    total += float(classification_loss(logits.float(), to_device(y, device, False))) * len(y)
                losses.append(total / len(split_out))
    finally:
        algorithm.train(was_training)
    return sum(losses) / len(losses) if losses else float("nan")
