"""Neuron statistics from activations: class selectivity and class-conditional activation rates.

Selectivity follows the feature-contamination paper (Zhang et al., ICML 2024, after Morcos
et al. 2018): with mu_c a neuron's mean post-nonlinearity activation over the examples of
class c, mu_max = max_c mu_c and mu_rest the mean of the other classes' mu,
selectivity = (mu_max - mu_rest) / (mu_max + mu_rest + eps). A neuron of a convolution
is a channel; its activation on an example is the channel's mean over positions.

A channel's activation rate counts it per position: the fraction of (example, position)
pairs of a class where the channel's output is > 0. Reading "the mean over positions is
> 0" instead (any position fired) saturates at 1 on ResNets, whose channels fire somewhere
on nearly every image.
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


def firing_fractions(output: torch.Tensor) -> torch.Tensor:
    """[examples, neurons]: per example, the fraction of a neuron's positions where its output is > 0
    (0 or 1 for a flat output, a fraction of positions for a feature map)."""
    fired = (output > 0).float()
    if output.dim() == 2:
        return fired
    if output.dim() > 2:
        return fired.flatten(2).mean(-1)
    raise ValueError(f"cannot read neurons from an output of shape {tuple(output.shape)}")


def activation_rates(activations: torch.Tensor, labels: torch.Tensor, num_classes: int,
                     fired: torch.Tensor | None = None) -> torch.Tensor:
    """[num_classes, neurons]: the fraction of each class's examples on which the neuron fires.

    With `fired` ([examples, neurons] `firing_fractions` of a feature map), the fraction of
    the class's (example, position) pairs where the channel's output is > 0 (every example has
    the same number of positions, so this is the class mean of `fired`); without it, the
    fraction of examples whose activation is > 0.
    """
    return class_means((activations > 0).double() if fired is None else fired.double(), labels, num_classes)


def capture_activations(
    forward: Callable[[torch.Tensor], torch.Tensor],
    layers: Mapping[str, nn.Module],
    batches: Iterable[torch.Tensor],
    fired: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Per layer, [examples, neurons] activations (see `neuron_activations`) over `batches`, on the CPU.

    `forward` runs the model on one batch; every module in `layers` records its output. When
    `fired` is a dict, it receives per layer the [examples, neurons] `firing_fractions`.
    """
    captured: dict[str, list[torch.Tensor]] = {name: [] for name in layers}
    fractions: dict[str, list[torch.Tensor]] = {name: [] for name in layers}

    def hook(name: str):
        def record(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            captured[name].append(neuron_activations(output.detach()).float().cpu())
            if fired is not None:
                fractions[name].append(firing_fractions(output.detach()).cpu())
        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in layers.items()]
    try:
        with torch.inference_mode():
            for x in batches:
                forward(x)
    finally:
        for handle in handles:
            handle.remove()
    if fired is not None:
        fired.update({name: torch.cat(parts) if parts else torch.zeros(0, 0) for name, parts in fractions.items()})
    return {name: torch.cat(parts) if parts else torch.zeros(0, 0) for name, parts in captured.items()}


def layer_statistics(activations: torch.Tensor, labels: torch.Tensor, num_classes: int,
                     fired: torch.Tensor | None = None) -> dict:
    """Selectivity (per neuron and its summary) and per-class activation rates of one layer on one set of examples.

    `fired`: the layer's `firing_fractions` on the same examples (per position for feature
    maps); without it a neuron fires on an example when its activation is > 0.
    """
    means = class_means(activations, labels, num_classes)
    sel = selectivity(means)
    rates = activation_rates(activations, labels, num_classes, fired)
    return {
        "selectivity": summary(sel),
        "selectivity_per_neuron": [round(float(v), 6) for v in sel],
        "activation_rate_per_class": [float(v) for v in rates.nanmean(1)],
        "dead_fraction": float((activations <= 0).all(0).double().mean()) if activations.numel() else float("nan"),
    }
