"""Neuron statistics from activations: class selectivity and class-conditional activation rates.

Selectivity follows the feature-contamination paper (Zhang et al., ICML 2024, after Morcos
et al. 2018): with mu_c a neuron's mean post-nonlinearity activation over the examples of
class c, mu_max = max_c mu_c and mu_rest the mean of the other classes' mu,
selectivity = (mu_max - mu_rest) / (mu_max + mu_rest + eps). A neuron of a convolution
is a channel; its activation on an example is the channel's mean over positions.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import torch
from torch import nn

from domaingen.stats import summary

SELECTIVITY_EPS = 1e-8


def neuron_activations(output: torch.Tensor) -> torch.Tensor:
    """A layer's output as [examples, neurons]: flat outputs as they are, feature maps averaged over positions."""
    if output.dim() == 2:
        return output
    if output.dim() > 2:
        return output.flatten(2).mean(-1)
    raise ValueError(f"cannot read neurons from an output of shape {tuple(output.shape)}")


def class_means(activations: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[num_classes, neurons] mean activation per class; NaN rows for classes without examples."""
    acts = activations.double()
    onehot = torch.nn.functional.one_hot(labels.long(), num_classes).double()  # [N, C]
    counts = onehot.sum(0)
    sums = onehot.t() @ acts
    return sums / counts.unsqueeze(1)  # 0/0 = NaN for an absent class


def selectivity(means: torch.Tensor, eps: float = SELECTIVITY_EPS) -> torch.Tensor:
    """Per neuron, (mu_max - mean of the other classes' mu) / (mu_max + that mean + eps).

    `means` is [classes, neurons] (NaN rows, classes without examples, are left out).
    A neuron silent on every class has selectivity 0.
    """
    present = ~torch.isnan(means).any(1)
    mu = means[present]
    if mu.shape[0] < 2:
        return torch.full((means.shape[1],), float("nan"), dtype=means.dtype)
    mu_max = mu.max(0).values
    rest = (mu.sum(0) - mu_max) / (mu.shape[0] - 1)
    return (mu_max - rest) / (mu_max + rest + eps)


def activation_rates(activations: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[num_classes, neurons]: the fraction of each class's examples on which the neuron's activation is > 0."""
    return class_means((activations > 0).double(), labels, num_classes)


def capture_activations(
    forward: Callable[[torch.Tensor], torch.Tensor],
    layers: Mapping[str, nn.Module],
    batches: Iterable[torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Per layer, [examples, neurons] activations (see `neuron_activations`) over `batches`, on the CPU.

    `forward` runs the model on one batch; every module in `layers` records its output.
    """
    captured: dict[str, list[torch.Tensor]] = {name: [] for name in layers}

    def hook(name: str):
        def record(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            captured[name].append(neuron_activations(output.detach()).float().cpu())
        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in layers.items()]
    try:
        with torch.inference_mode():
            for x in batches:
                forward(x)
    finally:
        for handle in handles:
            handle.remove()
    return {name: torch.cat(parts) if parts else torch.zeros(0, 0) for name, parts in captured.items()}


def layer_statistics(activations: torch.Tensor, labels: torch.Tensor, num_classes: int) -> dict:
    """Selectivity (per neuron and its summary) and per-class activation rates of one layer on one set of examples."""
    means = class_means(activations, labels, num_classes)
    sel = selectivity(means)
    rates = activation_rates(activations, labels, num_classes)
    return {
        "selectivity": summary(sel),
        "selectivity_per_neuron": [round(float(v), 6) for v in sel],
        "activation_rate_per_class": [float(v) for v in rates.nanmean(1)],
        "dead_fraction": float((activations <= 0).all(0).double().mean()) if activations.numel() else float("nan"),
    }
