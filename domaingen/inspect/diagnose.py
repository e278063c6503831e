"""`domaingen diagnose`: neuron statistics per layer and environment, plus the algorithm's own sections.

The examples of an environment are its held-out data: a training environment's `out`
split (never trained on) and a test environment's `in` split (where test accuracy is
measured), at most `max_examples` of each, in split order.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from domaingen.inspect.neurons import capture_activations, layer_statistics
from domaingen.datasets.splits import Split
from domaingen.devices import to_device
from domaingen.run.reload import LoadedRun

log = logging.getLogger(__name__)

DEFAULT_MAX_EXAMPLES = 2000
BATCH_SIZE = 256


def diagnostic_split(loaded: LoadedRun, env: int, max_examples: int) -> Split:
    """The examples `diagnose` reads for environment `env` (see the module docstring)."""
    split_in, split_out = loaded.splits[env]
    split = split_in if env in loaded.test_envs or len(split_out) == 0 else split_out
    return Split(split.env, split.index[:max_examples])


def environment_activations(loaded: LoadedRun, split: Split,
                            fired: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(per layer [examples, neurons] activations, labels) of the algorithm on `split`; `fired`, when
    given, receives the per-position firing fractions (see neurons.capture_activations)."""
    algorithm = loaded.algorithm
    labels: list[torch.Tensor] = []

    def inputs():
        for x, y in loaded.dataset.eval_batches(split, BATCH_SIZE):
            labels.append(y.cpu())
            yield to_device(x, loaded.device)

    was_training = algorithm.training
    algorithm.eval()
    try:
        acts = capture_activations(algorithm.activation_forward, algorithm.activation_layers(), inputs(), fired)
    finally:
        algorithm.train(was_training)
    return acts, torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long)


def diagnose(loaded: LoadedRun, max_examples: int = DEFAULT_MAX_EXAMPLES) -> dict[str, Any]:
    """Every quantity `domaingen diagnose` reports, JSON-ready (without the domain masks)."""
    num_classes = loaded.dataset.num_classes
    envs = []
    per_env: dict[int, tuple[dict[str, torch.Tensor], torch.Tensor]] = {}
    fired: dict[int, dict[str, torch.Tensor]] = {}
    for i in range(len(loaded.splits)):
        split = diagnostic_split(loaded, i, max_examples)
        fired[i] = {}
        per_env[i] = environment_activations(loaded, split, fired[i])
        envs.append({"index": i, "name": split.env.name, "role": "test" if i in loaded.test_envs else "train",
                     "split": "in" if i in loaded.test_envs else "out", "examples": len(split)})
    layers: dict[str, Any] = {}
    layer_names = list(per_env[0][0]) if per_env else []
    for name in layer_names:
        entry: dict[str, Any] = {"neurons": int(per_env[0][0][name].shape[1]), "per_env": {}}
        for i, (acts, labels) in per_env.items():
            entry["per_env"][f"env{i}"] = layer_statistics(acts[name], labels, num_classes, fired[i][name])
        for role in ("train", "test"):
            members = [i for i in per_env if (i in loaded.test_envs) == (role == "test")]
            if members:
                acts = torch.cat([per_env[i][0][name] for i in members])
                labels = torch.cat([per_env[i][1] for i in members])
                entry[role] = layer_statistics(acts, labels, num_classes, torch.cat([fired[i][name] for i in members]))
        layers[name] = entry
    return {
        "run": str(loaded.path),
        "algorithm": loaded.args["algorithm"],
        "dataset": loaded.args["dataset"],
        "test_envs": loaded.test_envs,
        "checkpoint": loaded.checkpoint,
        "step": loaded.step,
        "data_source": loaded.dataset.data_source,
        "num_classes": num_classes,
        "max_examples": max_examples,
        "environments": envs,
        "layers": layers,
        "sections": {**loaded.algorithm.model_diagnostics(), **_contamination(loaded, max_examples)},
    }


def _contamination(loaded: LoadedRun, max_examples: int) -> dict[str, Any]:
    """FeatureContamination's section (inspect/contamination.py) on the training environments' held-out examples."""
    if not hasattr(loaded.dataset, "core_basis"):
        return {}
    from domaingen.inspect.contamination import SECTION, contamination_section

    splits = [diagnostic_split(loaded, i, max_examples) for i in range(len(loaded.splits)) if i not in loaded.test_envs]
    batches = [split.batch(slice(0, len(split))) for split in splits]
    x = torch.cat([b[0] for b in batches])
    labels = torch.cat([b[1] for b in batches])
    section = contamination_section(loaded.algorithm, loaded.dataset, to_device(x, loaded.device), labels)
    return {SECTION: section} if section else {}


DEFAULT_MASK_STEPS = 300
MASK_BATCH_SIZE = 64


class _Predict(torch.nn.Module):
    """The algorithm's default prediction as a module, so torch.func.functional_call can swap its weights."""

    def __init__(self, algorithm: torch.nn.Module) -> None:
        super().__init__()
        self.alg = algorithm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alg.predict(x)


def domain_weight_masks(
    loaded: LoadedRun,
    steps: int = DEFAULT_MASK_STEPS,
    batch_size: int = MASK_BATCH_SIZE,
    alpha: float | None = None,
    max_examples: int = DEFAULT_MAX_EXAMPLES,
) -> dict[str, Any]:
    """Csordás-style weight masks, one per training domain on its `in` split, and their overlap per layer.

    Also each domain's accuracy, with its own mask, on (at most `max_examples` of) its `out`
    split, beside the unmasked network's: a mask that keeps what the domain needs keeps its accuracy.
    """
    from torch.func import functional_call

    from domaingen.algorithms.base import classification_loss
    from domaingen.inspect.domain_masks import (
        MASK_ALPHA,
        MASK_LR,
        mask_overlap,
        maskable_weights,
        masked_accuracy,
        train_weight_mask,
    )

    alpha = MASK_ALPHA if alpha is None else float(alpha)

    algorithm = loaded.algorithm
    wrapper = _Predict(algorithm)
    weights = {f"alg.{name}": w for name, w in maskable_weights(algorithm).items()
               if name.startswith(("featurizer.", "classifier")) or not hasattr(algorithm, "featurizer")}

    def forward(masked: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(wrapper, masked, (x,), strict=False)

    train_envs = [i for i in range(len(loaded.splits)) if i not in loaded.test_envs]
    per_domain, accuracy = [], []
    everything = {name: torch.ones_like(w, dtype=torch.bool) for name, w in weights.items()}
    was_training = algorithm.training
    algorithm.eval()
    try:
        for d, env in enumerate(train_envs):
            sampler = loaded.dataset.minibatch_sampler([loaded.splits[env][0]], batch_size, loaded.args["seed"] + d,
                                                       loaded.device)
            batches = (sampler.next()[0] for _ in iter(int, 1))
            masks = train_weight_mask(forward, weights, batches, classification_loss, steps, alpha=alpha)
            per_domain.append(masks)
            split = loaded.splits[env][1]
            split = Split(split.env, split.index[:max_examples])

            def held_out():
                return ((to_device(x, loaded.device), y) for x, y in loaded.dataset.eval_batches(split, BATCH_SIZE))

            accuracy.append({"domain": loaded.dataset.environments[env].name,
                             "masked": masked_accuracy(forward, weights, masks, held_out()),
                             "unmasked": masked_accuracy(forward, weights, everything, held_out())})
            log.info("domain mask %d/%d trained (%d steps)", d + 1, len(train_envs), steps)
    finally:
        algorithm.train(was_training)
    layers = {}
    for name in weights:
        stacked = torch.stack([masks[name].flatten().cpu() for masks in per_domain])
        layers[name[len("alg."):].removesuffix(".weight")] = {"weights": int(stacked.shape[1]), **mask_overlap(stacked)}
    return {"domains": [loaded.dataset.environments[e].name for e in train_envs], "steps": steps,
            "batch_size": batch_size, "mask_lr": MASK_LR, "alpha": alpha, "accuracy": accuracy, "layers": layers}
