"""`diagnose` on FeatureContamination: per-neuron weight projections and class-activation asymmetry.

Zhang et al. (ICML 2024) explain feature contamination by an asymmetry: a hidden neuron's
positive activation concentrates on one class, so the gradient that grows its core weights
also grows its weights on background features (which are present, with a non-zero mean, in
every example of that class). Per hidden neuron j of the first layer (pre-activation
h_j = w_j . x + b_j):

- `core_projection` and `background_projection`: the norm of w_j's projection onto each
  subspace (the quantities the records average, `fc_*_projection`);
- `asymmetry`: the share of the neuron's positive part sum_i max(h_j(x_i), 0) that comes from
  its dominant class (0.5: both classes alike, 1: one class only), over the training
  environments' held-out examples. It reads the pre-activation, so it is defined for every
  activation, the linear ablation's included.
"""

from __future__ import annotations

from typing import Any

import torch

from domaingen.datasets.contamination import first_layer_weight, subspace_projections
from domaingen.stats import summary

SECTION = "feature_contamination"


def class_asymmetry(pre_activations: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Per neuron, max_c P_c / sum_c P_c with P_c the sum of max(h, 0) over class c's examples;
    NaN for a neuron never positive. `pre_activations` is [examples, neurons]."""
    positive = pre_activations.double().clamp(min=0)
    onehot = torch.nn.functional.one_hot(labels.long(), num_classes).double()
    per_class = onehot.T @ positive  # [classes, neurons]
    total = per_class.sum(0)
    return torch.where(total > 0, per_class.max(0).values / total, torch.full_like(total, float("nan")))


def per_neuron_projections(weight: torch.Tensor, core: torch.Tensor,
                           background: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per neuron (row of `weight`), the norms of its projections onto the core and background rows."""
    return (weight @ core.T).norm(dim=1), (weight @ background.T).norm(dim=1)


def first_layer_pre_activations(model: torch.nn.Module, n_inputs: int, x: torch.Tensor) -> torch.Tensor | None:
    """The first n_inputs-reading nn.Linear's outputs on `x` (recorded by a hook during `model.predict`)."""
    layer = next((m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.in_features == n_inputs), None)
    if layer is None:
        return None
    captured: list[torch.Tensor] = []
    handle = layer.register_forward_hook(lambda module, inputs, output: captured.append(output.detach().float().cpu()))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model.predict(x)
    finally:
        handle.remove()
        model.train(was_training)
    return captured[0] if captured else None


def contamination_section(model: torch.nn.Module, dataset: Any, x: torch.Tensor,
                          labels: torch.Tensor) -> dict[str, Any]:
    """The `feature_contamination` section of diagnostics.json ({} for other datasets), keyed by layer.

    `x`, `labels`: the examples the asymmetry is measured on (diagnose passes the training
    environments' held-out examples).
    """
    if not hasattr(dataset, "core_basis"):
        return {}
    weight = first_layer_weight(model, dataset.DIM)
    if weight is None:
        return {}
    core, background = per_neuron_projections(weight, dataset.core_basis, dataset.background_basis)
    mean_core, mean_background = subspace_projections(weight, dataset.core_basis, dataset.background_basis)
    fields: dict[str, Any] = {
        "neurons": int(weight.shape[0]),
        "core_projection": mean_core,
        "background_projection": mean_background,
        "projection_ratio": mean_background / mean_core if mean_core > 0 else float("inf"),
        "core_projection_per_neuron": [round(float(v), 6) for v in core],
        "background_projection_per_neuron": [round(float(v), 6) for v in background],
    }
    pre = first_layer_pre_activations(model, dataset.DIM, x)
    if pre is not None:
        asym = class_asymmetry(pre, labels, dataset.num_classes)
        stats = summary(asym)
        fields.update(asymmetry_mean=stats["mean"], asymmetry_median=stats["median"],
                      asymmetry_per_neuron=[round(float(v), 6) for v in asym])
    return {"first_layer": fields}
