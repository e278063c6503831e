"""DMG (Chattopadhyay et al., ECCV 2020): domain-specific neuron masks for generalization.

Every training domain has one mask logit per neuron (per channel for
convolutions) on the inputs of a few late layers. Training multiplies each
example's activations by a straight-through Bernoulli sample of its own
domain's mask and adds lambda_O times the soft-IoU overlap of the domains'
masks: by default the paper's sum over masked layers and domain pairs
(`dmg_overlap_reduction` "sum"); "mean" averages over the pairs within a layer,
as the authors' public code does (models/supermasks.py, `overlap_penalty`). `dmg_lambda_s`
(default 0, off) adds lambda_S times the L1 norm of the keep probabilities (every domain's
sigmoid(logit) summed over neurons and layers), the sparsity incentive of the authors' code
(OPTIM.SPARSITY_LAMBDA, `sparsity_penalty`). Test-time modes: Pred-Ens (the default) averages the logits over the
source domains' soft masks, Mask-Ens uses the mean soft mask, and known-domain
(KD) uses the example's own domain's soft mask.

`dmg_preset` "paper" follows the optimisation of the authors' PACS config
(configs/PACS/supermask_training.yml): Adam at 1e-4 for network and masks, weight
decay 1e-5 on both, and the network's learning rate times 0.99 per epoch (their
trainer steps only the network's scheduler; the masks' stays commented out). An
algorithm does not know epochs, so the decay comes every `dmg_decay_every` updates.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from domaingen.algorithms.base import (
    ALGORITHMS,
    FeaturizerClassifier,
    Minibatches,
    classification_loss,
    concat,
    make_adam,
    parameter_groups,
)
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, log_uniform, log_uniform_or_zero
from domaingen.masks.neuron_masks import (
    DomainNeuronMasks,
    check_overlap_reduction,
    straight_through_bernoulli,
)
from domaingen.masks import neuron_mask_statistics, pairwise_soft_iou
from domaingen.networks import MLP, MNIST_CNN, TwoLayer

MODES = ("pred_ens", "mask_ens", "kd")
# optimisation presets: "domainbed" (the run's lr and weight decay, masks at dmg_mask_lr
# without decay, no schedule) or "paper" (PAPER_PRESET, the authors' PACS config)
PRESETS = ("domainbed", "paper")
PAPER_PRESET = {"lr": 1e-4, "weight_decay": 1e-5, "dmg_mask_lr": 1e-4}
PAPER_DECAY = 0.99
# Pred-Ens tiles a batch over the domains from the first masked layer on; this bounds the rows
# of one tiled pass (memory), splitting larger batches. On a CPU the bound is cache-sized, as
# evaluation's CPU batches are (run.evaluation.CPU_EVAL_BATCH_SIZE): a 128-image MNIST_CNN batch
# tiled over 5 domains (640 rows) streams its activations through memory, and passes of 125 rows
# took 0.70x the time (2 vCPUs of an AMD EPYC Zen 3, 1 thread; results/benchmarks.md).
PRED_ENS_MAX_ROWS = 4096
PRED_ENS_CPU_ROWS = 128


def pred_ens_rows(device: torch.device) -> int:
    """The most rows of one tiled Pred-Ens pass on `device` (examples x domains)."""
    return PRED_ENS_CPU_ROWS if device.type == "cpu" else PRED_ENS_MAX_ROWS


def auto_mask_layers(featurizer: nn.Module) -> list[str]:
    """The default masked layers for a featurizer, as module names relative to the algorithm.

    MNIST_CNN: the inputs of its last two convolutions and of the classifier; MLP:
    the inputs of its Linear layers after the first and of the classifier (the
    hidden activations); a ResNet featurizer (attribute `resnet`): the inputs of
    layer3, layer4 and the classifier; TwoLayer: the classifier's input (its hidden layer).
    """
    if isinstance(featurizer, MNIST_CNN):
        convs = [name for name, m in featurizer.named_modules() if isinstance(m, nn.Conv2d)]
        return [f"featurizer.{name}" for name in convs[-2:]] + ["classifier"]
    if isinstance(featurizer, MLP):
        linears = [name for name, m in featurizer.named_modules() if isinstance(m, nn.Linear)]
        return [f"featurizer.{name}" for name in linears[1:]] + ["classifier"]
    if isinstance(getattr(featurizer, "resnet", None), nn.Module):
        return ["featurizer.resnet.layer3", "featurizer.resnet.layer4", "classifier"]
    if isinstance(featurizer, TwoLayer):  # its one hidden layer: the classifier's input
        return ["classifier"]
    raise DomaingenError(
        f"DMG has no default masked layers for the featurizer {type(featurizer).__name__}; "
        "name them in the dmg_layers hyperparameter (comma-separated module names)"
    )


def input_width(module: nn.Module) -> int:
    """Neurons (Linear) or channels (convolution) of a module's input: those of its first such layer."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            return m.in_features
        if isinstance(m, nn.modules.conv._ConvNd):
            return m.in_channels
    raise DomaingenError(f"cannot mask the input of {type(module).__name__}: it holds no Linear or convolution layer")


def layer_names(spec: str) -> list[str]:
    """The module names of a dmg_layers value other than 'auto', refused when empty or repeated
    (checks that need no network, so they run before a run writes anything)."""
    names = [part.strip() for part in str(spec).split(",") if part.strip()]
    if not names:
        raise DomaingenError("dmg_layers is empty; use 'auto' or comma-separated module names such as 'classifier'")
    if len(set(names)) < len(names):
        raise DomaingenError(f"dmg_layers names a module twice: {spec!r}")
    return names


def parse_mask_layers(spec: str, algorithm: nn.Module, featurizer: nn.Module) -> list[str]:
    """The dmg_layers hyperparameter ('auto' or comma-separated module names) -> validated names."""
    if str(spec).strip() == "auto":
        return auto_mask_layers(featurizer)
    names = layer_names(spec)
    modules = dict(algorithm.named_modules())
    for name in names:
        if name not in modules or name in ("", "network", "masks") or name.startswith(("network.", "masks")):
            examples = [n for n, m in modules.items() if isinstance(m, (nn.Linear, nn.Conv2d)) and not n.startswith("network")]
            shown = ", ".join(examples[:8]) + (", ..." if len(examples) > 8 else "")
            raise DomaingenError(f"unknown module '{name}' in dmg_layers; valid names include {shown}")
    return names


@ALGORITHMS.register("DMG")
class DMG(FeaturizerClassifier):
    """Cross-entropy under per-domain straight-through Bernoulli neuron masks + lambda_O * soft-IoU overlap
    (+ lambda_S * the masks' L1 norm, when dmg_lambda_s > 0)."""

    HPARAMS = {
        "dmg_lambda_o": HParam(0.1, log_uniform_or_zero(-5, 0, 0.2), "weight lambda_O of the soft-IoU mask overlap penalty"),
        "dmg_overlap_reduction": HParam(
            "sum", None,
            "soft IoU over domain pairs, per masked layer: sum (the paper's equation) or mean (the authors' code); "
            "summed over layers either way",
        ),
        "dmg_lambda_s": HParam(
            0.0, None,
            "weight lambda_S of the L1 sparsity penalty (the keep probabilities summed over domains, neurons and "
            "layers); 0 leaves it out",
        ),
        "dmg_mask_lr": HParam(1e-3, log_uniform(-4, -2), "Adam learning rate of the mask logits"),
        "dmg_layers": HParam("auto", None, "masked module inputs: 'auto' or comma-separated module names"),
        "dmg_preset": HParam(
            "domainbed", None,
            "optimisation: domainbed (the run's lr and weight decay) or paper (Adam 1e-4 for network and masks, "
            "weight decay 1e-5, network lr x0.99 every dmg_decay_every updates); explicit lr, weight_decay, "
            "dmg_mask_lr win",
        ),
        "dmg_decay_every": HParam(
            42, None,
            "updates per learning-rate decay of the paper preset (one epoch: ceil(smallest training env / batch "
            "size); 42 is PACS's 0.8 * 1670 photos at batch 32)",
        ),
    }
    EVAL_MODES = {"mask_ens": False, "kd": True}

    @classmethod
    def check_hparams(cls, hparams) -> None:
        super().check_hparams(hparams)
        for key, what in (
            ("dmg_lambda_o", "the weight of the overlap penalty"),
            ("dmg_lambda_s", "the weight of the sparsity penalty"),
            ("dmg_mask_lr", "a learning rate"),
        ):
            if key in hparams and not float(hparams[key]) >= 0:
                raise DomaingenError(f"{key} must be >= 0 ({what}), got {hparams[key]}")
        if "dmg_layers" in hparams and str(hparams["dmg_layers"]).strip() != "auto":
            layer_names(hparams["dmg_layers"])
        if "dmg_overlap_reduction" in hparams:
            check_overlap_reduction(hparams["dmg_overlap_reduction"], "dmg_overlap_reduction")
        if "dmg_preset" in hparams and hparams["dmg_preset"] not in PRESETS:
            raise DomaingenError(f"dmg_preset must be one of {', '.join(PRESETS)}, got {hparams['dmg_preset']!r}")
        if "dmg_decay_every" in hparams and not int(hparams["dmg_decay_every"]) >= 1:
            raise DomaingenError(f"dmg_decay_every must be >= 1 (updates per decay), got {hparams['dmg_decay_every']}")

    @classmethod
    def fit_hparams(cls, hparams, num_train_domains, explicit=()):
        """With dmg_preset "paper", the preset's lr, weight_decay and dmg_mask_lr replace the
        drawn or default values; values the user set (`explicit`) stay."""
        fitted = dict(hparams)
        if fitted.get("dmg_preset") == "paper":
            fitted.update({k: v for k, v in PAPER_PRESET.items() if k not in explicit})
        return fitted

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.mask_layers = parse_mask_layers(self.hparams["dmg_layers"], self, self.featurizer)
        modules = dict(self.named_modules())
        self.masks = DomainNeuronMasks([input_width(modules[name]) for name in self.mask_layers], num_domains)
        self._active_masks: list[torch.Tensor] | None = None
        for index, name in enumerate(self.mask_layers):
            modules[name].register_forward_pre_hook(functools.partial(self._mask_input, index))
        paper = self.hparams.get("dmg_preset", "domainbed") == "paper"
        network_groups = parameter_groups(self.network, self.hparams)
        mask_decay = float(self.hparams.get("weight_decay", 0.0)) if paper else 0.0
        self.optimizer = make_adam(
            [
                *network_groups,
                {"params": self.masks.parameters(), "lr": float(self.hparams["dmg_mask_lr"]), "weight_decay": mask_decay},
            ],
            self.hparams,
        )
        # the paper preset decays the network's groups (the first ones) from their initial lr
        self._decayed_groups = len(network_groups) if paper else 0
        self._base_lrs = [group["lr"] for group in self.optimizer.param_groups[: self._decayed_groups]]
        if paper:
            self.register_buffer("dmg_update_count", torch.tensor(0, dtype=torch.long))
        # mask samples come from the algorithm's own generator, saved with checkpoints, so
        # that a resumed run draws the same masks as an uninterrupted one
        self._mask_seed = int(torch.randint(2**31 - 1, ()).item())
        self._generator: torch.Generator | None = None

    # --- the masked forward pass ---

    def _mask_input(self, index: int, module: nn.Module, args: tuple) -> tuple | None:
        """Forward pre-hook: multiply the module's input by the active mask of layer `index`."""
        if self._active_masks is None:
            return None  # the bare network, without masks
        x, mask = args[0], self._active_masks[index]
        if mask.shape[0] != x.shape[0]:  # Pred-Ens: tile the batch over the domains, domain-major
            x = x.repeat(mask.shape[0] // x.shape[0], *([1] * (x.dim() - 1)))
        mask = mask.to(x.dtype).view(*mask.shape, *([1] * (x.dim() - 2)))
        return (x * mask, *args[1:])

    def _masked_forward(self, x: torch.Tensor, masks: Sequence[torch.Tensor]) -> torch.Tensor:
        """Logits with one [rows, width] mask per masked layer (rows: len(x), or a multiple for Pred-Ens)."""
        self._active_masks = list(masks)
        try:
            return self.network(x)
        finally:
            self._active_masks = None

    def _mask_generator(self, device: torch.device) -> torch.Generator:
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self._mask_seed)
        return self._generator

    def domain_labels(self, minibatches: Minibatches) -> torch.Tensor:
        """Each example's domain index: minibatch d holds domain d's examples."""
        y = minibatches[0][1]
        return torch.cat([torch.full((len(yb),), d, dtype=torch.long, device=y.device) for d, (_, yb) in enumerate(minibatches)])

    # --- training ---

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        if len(minibatches) != self.num_domains:
            raise DomaingenError(f"DMG was built for {self.num_domains} training domains but got {len(minibatches)} minibatches")
        x, y = concat(minibatches)
        domains = self.domain_labels(minibatches)
        generator = self._mask_generator(x.device)
        masks = [straight_through_bernoulli(probs[domains], generator) for probs in self.masks.probs()]
        nll = classification_loss(self._masked_forward(x, masks), y)
        penalty = self.masks.overlap_penalty(self.hparams["dmg_overlap_reduction"])
        loss = nll + float(self.hparams["dmg_lambda_o"]) * penalty
        lambda_s = float(self.hparams.get("dmg_lambda_s", 0.0))
        if lambda_s > 0:  # off by default: neither the loss nor the reported keys change
            sparsity = self.masks.sparsity_penalty()
            loss = loss + lambda_s * sparsity
        self.step(loss)
        if self._decayed_groups:
            self.dmg_update_count += 1
            self._set_decayed_lr()
        out = {"loss": loss.item(), "nll": nll.item(), "penalty": penalty.item()}
        if lambda_s > 0:
            out["sparsity"] = sparsity.item()
        return out

    def _set_decayed_lr(self) -> None:
        """Paper preset: the network's lr is its initial lr * 0.99^(updates // dmg_decay_every)."""
        periods = int(self.dmg_update_count.item()) // int(self.hparams["dmg_decay_every"])
        for group, base in zip(self.optimizer.param_groups, self._base_lrs):
            group["lr"] = base * PAPER_DECAY**periods

    # --- prediction ---

    def predict(
        self, x: torch.Tensor, domain: int | torch.Tensor | None = None, mode: str | None = None
    ) -> torch.Tensor:
        """Logits. Default mode: Pred-Ens without `domain`, known-domain (KD) with it."""
        if mode is None:
            mode = "pred_ens" if domain is None else "kd"
        return self.predict_mode(x, mode, domain)

    def predict_mode(self, x: torch.Tensor, mode: str, domain: int | torch.Tensor | None = None) -> torch.Tensor:
        """Logits in one test-time mode: 'pred_ens', 'mask_ens' or 'kd' (needs `domain`)."""
        if mode not in MODES:
            raise DomaingenError(f"unknown DMG test-time mode '{mode}'; valid modes: {', '.join(MODES)}")
        probs = self.masks.probs()
        n = x.shape[0]
        if mode == "kd":
            index = self._domain_index(domain, n, x.device)
            return self._masked_forward(x, [p[index] for p in probs])
        if mode == "mask_ens":
            return self._masked_forward(x, [p.mean(0).expand(n, -1) for p in probs])
        chunk = max(1, pred_ens_rows(x.device) // self.num_domains)
        return torch.cat([self._pred_ens(part, probs) for part in x.split(chunk)]) if n else self._pred_ens(x, probs)

    def _pred_ens(self, x: torch.Tensor, probs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Mean over domains of the logits under each domain's soft mask, in one tiled pass."""
        n = x.shape[0]
        logits = self._masked_forward(x, [p.repeat_interleave(n, dim=0) for p in probs])
        return logits.view(self.num_domains, n, -1).mean(0)

    def _domain_index(self, domain: int | torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor:
        """`domain` (one index, or one per example) as a [n] index tensor, checked against the domain count."""
        if domain is None:
            raise DomaingenError(
                "DMG known-domain (kd) mode needs the examples' domain labels: "
                "pass domain= a training-domain index or a tensor of one index per example"
            )
        index = torch.as_tensor(domain, device=device)
        if index.is_floating_point() or index.dtype == torch.bool:
            raise DomaingenError(f"domain must hold integer indices, got dtype {index.dtype}")
        index = index.long()
        if index.dim() == 0:
            index = index.expand(n)
        if index.shape != (n,):
            raise DomaingenError(f"domain must be one index or one per example ({n}), got shape {tuple(index.shape)}")
        if n and (int(index.min()) < 0 or int(index.max()) >= self.num_domains):
            bad = int(index.min()) if int(index.min()) < 0 else int(index.max())
            raise DomaingenError(
                f"domain index {bad} is out of range: DMG was trained on {self.num_domains} domains "
                f"(valid indices 0..{self.num_domains - 1})"
            )
        return index

    # --- records and checkpoints ---

    def diagnostics(self) -> dict[str, Any]:
        """Per masked layer k: dmg_layer{k}_{iou,active,shared,specific,unused}; dmg_iou, the mean over layers.

        These IoUs are discrete: of the thresholded masks (a neuron is active where its keep probability
        exceeds 0.5), not the soft IoU of the probabilities that the overlap penalty uses."""
        stats = self.masks.statistics()
        out: dict[str, Any] = {f"dmg_layer{k}_{key}": value for k, layer in enumerate(stats) for key, value in layer.items()}
        out["dmg_iou"] = sum(layer["iou"] for layer in stats) / len(stats)
        return out

    def activation_forward(self, x: torch.Tensor) -> torch.Tensor:
        """Mask-Ens: one pass with the domains' mean soft mask, so each example's activations are one row."""
        return self.predict_mode(x, "mask_ens")

    def model_diagnostics(self) -> dict[str, Any]:
        """dmg_masks: per masked layer, the domain x neuron soft masks, their discrete version
        (sigmoid(logit) > 0.5) and the pairwise IoU of the discrete masks (NaN for two empty masks)."""
        sections = dict(super().model_diagnostics())
        layers = {}
        with torch.no_grad():
            for name, probs in zip(self.mask_layers, self.masks.probs()):
                active = (probs > 0.5).float().cpu()
                stats = neuron_mask_statistics(active)
                layers[name] = {
                    "domains": int(probs.shape[0]),
                    "neurons": int(probs.shape[1]),
                    "mean_iou": stats["iou"],
                    "active": stats["active"],
                    "shared": stats["shared"],
                    "specific": stats["specific"],
                    "unused": stats["unused"],
                    "probs": probs.float().cpu().tolist(),
                    "mask": active.int().tolist(),
                    "iou": pairwise_soft_iou(active, eps=0.0).tolist(),
                }
        sections["dmg_masks"] = layers
        return sections

    def checkpoint_state(self) -> dict[str, Any]:
        state = super().checkpoint_state()
        state["mask_rng"] = self._mask_generator(self.masks.logits[0].device).get_state()
        return state

    def load_checkpoint_state(self, state) -> None:
        super().load_checkpoint_state(state)
        if "mask_rng" in state:
            self._mask_generator(self.masks.logits[0].device).set_state(state["mask_rng"].clone())
        if self._decayed_groups:
            self._set_decayed_lr()
