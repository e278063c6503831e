"""`domaingen diagnose`: neuron statistics per layer and environment, plus the algorithm's own sections.

The examples of an environment are its held-out data: a training environment's `out`
split (never trained on) and a test environment's `in` split (where test accuracy is
measured), at most `max_examples` of each, in split order.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from domaingen.inspect.neurons import capture_activations, layer_statistics
from domaingen.datasets.splits import Split
from domaingen.devices import to_device
from domaingen.run.reload import LoadedRun

log = logging.getLogger(__name__)

DEFAULT_MAX_EXAMPLES = 2000
BATCH_SIZE = 256


def diagnose_batch_size(algorithm: torch.nn.Module) -> int:
    """The batch `diagnose` feeds `algorithm`: its own evaluation batch when its predictions
    depend on the batch (ARM, MTL: Algorithm.EVAL_BATCH_SIZE), else BATCH_SIZE."""
    return int(getattr(algorithm, "EVAL_BATCH_SIZE", None) or BATCH_SIZE)


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
        for x, y in loaded.dataset.eval_batches(split, diagnose_batch_size(algorithm)):
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


MASK_HISTOGRAM_BINS = 20


def domain_weight_masks(
    loaded: LoadedRun,
    steps: int = DEFAULT_MASK_STEPS,
    batch_size: int = MASK_BATCH_SIZE,
    alpha: float | None = None,
    max_examples: int = DEFAULT_MAX_EXAMPLES,
    mask_seeds: Sequence[int] = (),
) -> dict[str, Any]:
    """Csordás-style weight masks, one per training domain on its `in` split, and Csordás et al.'s tests.

    Besides each layer's kept fractions, overlaps (IoU) and asymmetric sharing s(t, r):
    `accuracy_matrix[t][e]`, the accuracy of domain t's mask on environment e's diagnostic
    examples (a training environment's `out` split, the held-out one's `in` split, as for
    the neuron statistics), `inverted_accuracy_matrix` the same with the inverted mask (only
    the weights t's mask removed), `unmasked_accuracy` per environment, a `control` mask
    trained on every training domain together at the same alpha (its accuracies, inverted
    ones and kept fraction), and `probability_histogram`: per mask, the counts of
    sigmoid(logit) over all masked weights in MASK_HISTOGRAM_BINS equal bins of [0, 1].
    `accuracy` is the short summary: each domain's masked and unmasked accuracy on its
    own `out` split. `kept_weights` counts each domain's kept weights (per layer too) and
    `weight_ratio[t][r]` is kept_weights[t] / kept_weights[r] (Csordás et al.: multiplication
    keeps 3.8x the weights of addition). `layer_order` names the masked layers from input to
    output (`layers` is a mapping, which diagnostics.json stores sorted by name).

    `mask_seeds` seeds the masks' training (their Gumbel noise and batches): mask d of seed s
    draws from seed s * 1000 + d; without seeds they draw from the run's seed, as they always
    have. With two or more seeds every domain's mask is trained once per seed; the report (and
    control) is the first seed's, and `seed_stability` compares each domain's masks across
    seeds: the IoU of every pair of seeds over all masked weights, their mean and standard
    deviation, and per layer the mean IoU (Csordás et al.: 93.26 +- 0.96 % on CIFAR-10).
    """
    from torch.func import functional_call

    from domaingen.algorithms.base import classification_loss
    from domaingen.inspect.domain_masks import (
        MASK_ALPHA,
        MASK_LR,
        SEED_STRIDE,
        check_mask_options,
        mask_overlap,
        mask_sharing,
        maskable_weights,
        masked_accuracy,
        seed_stability,
        train_mask_logits,
        weight_ratios,
    )
    from domaingen.masks import eval_mask
    from domaingen.stats import histogram

    alpha = MASK_ALPHA if alpha is None else float(alpha)
    train_envs = [i for i in range(len(loaded.splits)) if i not in loaded.test_envs]
    check_mask_options(len(train_envs), alpha)

    algorithm = loaded.algorithm
    wrapper = _Predict(algorithm)
    weights = {f"alg.{name}": w for name, w in maskable_weights(algorithm).items()
               if name.startswith(("featurizer.", "classifier")) or not hasattr(algorithm, "featurizer")}

    def forward(masked: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(wrapper, masked, (x,), strict=False)

    env_splits = [diagnostic_split(loaded, e, max_examples) for e in range(len(loaded.splits))]

    def accuracies(masks: dict[str, torch.Tensor]) -> list[float]:
        return [masked_accuracy(forward, weights, masks, ((to_device(x, loaded.device), y)
                                for x, y in loaded.dataset.eval_batches(split, diagnose_batch_size(algorithm))))
                for split in env_splits]

    def train(splits: list, seed: int, reseed: bool = False) -> dict[str, torch.Tensor]:
        if reseed:
            torch.manual_seed(seed)
        sampler = loaded.dataset.minibatch_sampler(splits, batch_size, seed, loaded.device)

        def batches():
            while True:
                parts = sampler.next()
                yield torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])

        return train_mask_logits(forward, weights, batches(), classification_loss, steps, alpha=alpha)

    everything = {name: torch.ones_like(w, dtype=torch.bool) for name, w in weights.items()}
    logits_per_mask: list[dict[str, torch.Tensor]] = []
    was_training = algorithm.training
    algorithm.eval()
    seeds = [int(s) for s in mask_seeds]
    first = seeds[0] * SEED_STRIDE if seeds else loaded.args["seed"]
    other_seeds: list[list[dict[str, torch.Tensor]]] = []
    try:
        for d, env in enumerate(train_envs):
            logits_per_mask.append(train([loaded.splits[env][0]], first + d, reseed=bool(seeds)))
            log.info("domain mask %d/%d trained (%d steps)", d + 1, len(train_envs), steps)
        for s in seeds[1:]:
            other_seeds.append([{n: eval_mask(l).bool() for n, l in
                                 train([loaded.splits[env][0]], s * SEED_STRIDE + d, reseed=True).items()}
                                for d, env in enumerate(train_envs)])
            log.info("domain masks of mask seed %d trained", s)
        control_logits = train([loaded.splits[e][0] for e in train_envs], first + len(train_envs), reseed=bool(seeds))
        log.info("control mask (every training domain) trained (%d steps)", steps)
        per_domain = [{n: eval_mask(l).bool() for n, l in logits.items()} for logits in logits_per_mask]
        control = {n: eval_mask(l).bool() for n, l in control_logits.items()}
        matrix = [accuracies(m) for m in per_domain]
        inverted = [accuracies({n: ~v for n, v in m.items()}) for m in per_domain]
        unmasked = accuracies(everything)
        control_entry = {"accuracy": accuracies(control),
                         "inverted_accuracy": accuracies({n: ~v for n, v in control.items()}),
                         "kept_fraction": _kept(control)}
    finally:
        algorithm.train(was_training)
    names = [loaded.dataset.environments[e].name for e in train_envs]
    layers = {}
    for name in weights:
        stacked = torch.stack([masks[name].flatten().cpu() for masks in per_domain])
        layers[name[len("alg."):].removesuffix(".weight")] = {
            "weights": int(stacked.shape[1]), **mask_overlap(stacked), "sharing": mask_sharing(stacked),
            "kept_weights": [int(v) for v in stacked.sum(1)],
            "control_kept_fraction": float(control[name].double().mean())}
    whole = torch.stack([torch.cat([m[n].flatten().cpu() for n in weights]) for m in per_domain])
    kept = [int(v) for v in whole.sum(1)]

    def probabilities(logits: dict[str, torch.Tensor]) -> list[int]:
        probs = torch.sigmoid(torch.cat([l.flatten().float().cpu() for l in logits.values()]))
        return histogram(probs, MASK_HISTOGRAM_BINS)

    return {
        "domains": names, "steps": steps, "batch_size": batch_size, "mask_lr": MASK_LR, "alpha": alpha,
        "mask_seeds": seeds,
        "layer_order": [name[len("alg."):].removesuffix(".weight") for name in weights],
        "accuracy": [{"domain": names[d], "masked": matrix[d][env], "unmasked": unmasked[env]}
                     for d, env in enumerate(train_envs)],
        "environments": [split.env.name for split in env_splits],
        "test_envs": list(loaded.test_envs),
        "accuracy_matrix": matrix,
        "inverted_accuracy_matrix": inverted,
        "unmasked_accuracy": unmasked,
        "control": control_entry,
        "sharing": mask_sharing(whole),
        "kept_weights": kept,
        "weight_ratio": weight_ratios(kept),
        "probability_histogram": {"bins": MASK_HISTOGRAM_BINS,
                                  "counts": {**{names[d]: probabilities(l) for d, l in enumerate(logits_per_mask)},
                                             "control": probabilities(control_logits)}},
        "layers": layers,
        **({"seed_stability": seed_stability(names, seeds, [per_domain, *other_seeds],
                                             {n: n[len("alg."):].removesuffix(".weight") for n in weights})}
           if len(seeds) > 1 else {}),
    }


def _kept(masks: dict[str, torch.Tensor]) -> float:
    """The share of all masked weights a mask keeps."""
    kept = sum(int(m.sum()) for m in masks.values())
    return kept / max(1, sum(m.numel() for m in masks.values()))
