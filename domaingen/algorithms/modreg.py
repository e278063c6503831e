"""ModReg (Ashok et al., AAAI-22 student abstract): modular-regularization weight masks on top of any algorithm.

`X+ModReg` is X with a Gumbel-sigmoid mask over every Linear and Conv2d weight
of its featurizer and classifier (domaingen.masks.weight_masks), trained jointly with the
weights by X's own optimizers, and with scale * (alpha * S1 + beta * S2) added to X's
loss, where for every masked layer and each input feature p, with pi = sigmoid(l)
(`modreg_pi` "sigmoid", the keep probability; "logit" reads pi as the logit l itself):

    S1 = sum_p (sum of pi over the weights leaving p)^2          (specialization)
    S2 = sum_p sqrt(sum of pi^2 over the weights leaving p)      (reuse, a group lasso)

The penalty is part of X's objective for every X: FeaturizerClassifier routes
every loss an algorithm backpropagates through `regularization(module)` (the L2
term), and X+ModReg adds alpha * S1 + beta * S2 of that module's mask logits
there. So the penalty enters before X rescales its loss (the IRM paper's
schedule divides it by the penalty weight with the rest, unless `modreg_rescaled`
is false, which multiplies it back), SAND-mask's sign mask
sees it in every environment's gradient, Fish adds it to each inner step's loss
on its inner clone, and DMG adds it beside its overlap penalty. Its gradient is
computed in closed form (`ModRegPenalty`), not by autograd through sigmoid and
sums over every weight.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from domaingen.algorithms.base import ALGORITHMS, Algorithm, FeaturizerClassifier, Minibatches
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, log_uniform
from domaingen.masks.weight_masks import (
    add_weight_masks,
    masked_layers,
    outgoing_sums,
    subnetwork_stats,
    weight_mask_logits,
)
from domaingen.stats import histogram, summary

MODIFIER = "ModReg"
# What pi is in S1 and S2 (the abstract writes both "pi in [0, 1]" and "sigmoid(pi) > 0.5"):
# "sigmoid", the keep probability sigmoid(l); "logit", the mask logit l itself.
PI_READINGS = ("sigmoid", "logit")


def penalty_and_gradient(
    logits: torch.Tensor, alpha: float, beta: float, reading: str = "sigmoid"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(S1, S2, d(alpha * S1 + beta * S2)/d logits) of one layer, in closed form (no autograd graph).

    `reading` says what pi is (PI_READINGS). With a weight (o, p, ...) leaving input feature p:
    "sigmoid", pi = sigmoid(l): dS1/dl = 2 * (sum of pi leaving p) * pi (1 - pi),
    dS2/dl = pi * pi (1 - pi) / sqrt(sum of pi^2 leaving p);
    "logit", pi = l: dS1/dl = 2 * (sum of l leaving p), dS2/dl = l / sqrt(sum of l^2 leaving p).
    """
    with torch.no_grad():
        values = logits.to(torch.promote_types(logits.dtype, torch.float32))
        pi = torch.sigmoid(values) if reading == "sigmoid" else values
        shape = [1, -1] + [1] * (logits.dim() - 2)
        sums = outgoing_sums(pi)
        norms = outgoing_sums(pi.square()).sqrt()
        # one fused coefficient per input feature, then a single pass over the weights
        coefficient = (2 * alpha) * sums.view(shape) + beta * pi / norms.clamp_min(1e-12).view(shape)
        grad = coefficient.mul_(pi).mul_(1 - pi) if reading == "sigmoid" else coefficient
        return sums.square().sum(), norms.sum(), grad.to(logits.dtype)


def penalty_gradient(logits: torch.Tensor, alpha: float, beta: float, reading: str = "sigmoid") -> torch.Tensor:
    """d(alpha * S1 + beta * S2)/d logits for one layer (see `penalty_and_gradient`)."""
    return penalty_and_gradient(logits, alpha, beta, reading)[2]


class ModRegPenalty(torch.autograd.Function):
    """alpha * S1 + beta * S2 summed over layers, with S1 and S2 as extra outputs that carry no gradient.

    Forward computes each layer's gradient with its value in one pass (`penalty_and_gradient`);
    backward scales it by the incoming gradient, so a loss that rescales the penalty
    (divides it by IRM's weight, say) rescales its gradient too.
    """

    @staticmethod
    def forward(ctx, alpha: float, beta: float, reading: str, *logits: torch.Tensor):  # type: ignore[override]
        parts = [penalty_and_gradient(layer, alpha, beta, reading) for layer in logits]
        ctx.grads = [grad for _, _, grad in parts]
        s1 = torch.stack([part[0] for part in parts]).sum()
        s2 = torch.stack([part[1] for part in parts]).sum()
        ctx.mark_non_differentiable(s1, s2)
        return alpha * s1 + beta * s2, s1, s2

    @staticmethod
    def backward(ctx, grad_penalty: torch.Tensor, *unused: Any):  # type: ignore[override]
        grads = [grad_penalty.to(g.dtype) * g for g in ctx.grads]
        ctx.grads = None
        return (None, None, None, *grads)


class ModRegMixin:
    """Adds weight masks and the S1/S2 penalty to a FeaturizerClassifier; see the module docstring."""

    HPARAMS = {
        "modreg_alpha": HParam(6.93e-10, log_uniform(-9, -5), "weight of S1, the specialization penalty"),
        "modreg_beta": HParam(1.12e-5, log_uniform(-5, -1), "weight of S2, the reuse (group lasso) penalty"),
        "modreg_scale": HParam(1.0, help="multiplies the whole penalty, modreg_scale * (alpha * S1 + beta * S2); > 0"),
        "modreg_pi": HParam("sigmoid", help="what pi is in S1 and S2: sigmoid (the keep probability sigmoid(l)) "
                            "or logit (the mask logit l)"),
        "modreg_rescaled": HParam(True, help="the penalty is divided with the rest of the loss where the base "
                                  "divides it (penalty_schedule irm_paper); false: it keeps its own scale"),
        "modreg_groups": HParam(4, help="mask samples per batch (the batch is cut into this many groups)"),
        "modreg_mask_lr": HParam(
            1e-3, log_uniform(-3, -1), "Adam learning rate of the mask logits (own group, no weight decay)"
        ),
        "modreg_init_logit": HParam(2.0, help="initial mask logit: 2.0 keeps a weight with probability 0.88 "
                                   "(ours; Csordas et al. start at probability 0.9, logit 2.197)"),
        "modreg_mask_bias": HParam(False, help="mask biases too (they are never in S1/S2)"),
    }

    # grouped convolutions over a batch cut into groups are free views of NCHW tensors, not of channels-last ones
    prefers_channels_last = False
    hparams: dict[str, Any]
    featurizer: nn.Module
    classifier: nn.Module

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.check_mask_groups()

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any]) -> None:
        super().check_hparams(hparams)  # type: ignore[misc]
        for key in ("modreg_alpha", "modreg_beta"):
            if not float(hparams[key]) >= 0:
                raise DomaingenError(f"{key} must be >= 0 (it weighs a penalty), got {hparams[key]}")
        if not float(hparams["modreg_scale"]) > 0:
            raise DomaingenError(f"modreg_scale must be > 0 (it multiplies ModReg's penalty), got {hparams['modreg_scale']}")
        if not float(hparams["modreg_mask_lr"]) > 0:
            raise DomaingenError(
                f"modreg_mask_lr must be > 0 (the Adam learning rate of the mask logits), got {hparams['modreg_mask_lr']}"
            )
        if hparams["modreg_pi"] not in PI_READINGS:
            raise DomaingenError(f"modreg_pi must be one of {', '.join(PI_READINGS)}, got {hparams['modreg_pi']!r}")
        if not isinstance(hparams["modreg_rescaled"], bool):
            raise DomaingenError(f"modreg_rescaled must be true or false, got {hparams['modreg_rescaled']!r}")

    def penalty_weights(self) -> tuple[float, float]:
        """(alpha, beta) as the penalty applies them: modreg_scale times modreg_alpha and modreg_beta."""
        scale = float(self.hparams["modreg_scale"])
        return scale * float(self.hparams["modreg_alpha"]), scale * float(self.hparams["modreg_beta"])

    def prepare_modules(self) -> None:
        super().prepare_modules()  # type: ignore[misc]
        self.check_hparams(self.hparams)
        add_weight_masks(
            nn.ModuleDict({"featurizer": self.featurizer, "classifier": self.classifier}),
            groups=int(self.hparams["modreg_groups"]),
            init_logit=float(self.hparams["modreg_init_logit"]),
            mask_bias=bool(self.hparams["modreg_mask_bias"]),
        )

    def check_mask_groups(self) -> None:
        """Every optimizer holds the mask logits it trains in groups of their own, at `modreg_mask_lr`.

        A base algorithm that builds an optimizer from bare parameters instead of its
        module (`make_adam(module, hparams)`) would train the masks at the weights' rate.
        """
        logits = {id(p) for p in weight_mask_logits(self)}  # type: ignore[arg-type]
        lr = float(self.hparams["modreg_mask_lr"])
        for name, optimizer in self.optimizers().items():  # type: ignore[attr-defined]
            for group in optimizer.param_groups:
                masks = [id(p) in logits for p in group["params"]]
                if any(masks) and not (all(masks) and group["lr"] == lr and group["weight_decay"] == 0):
                    raise DomaingenError(
                        f"{type(self).__name__}.{name} trains mask logits with the weights; build it with "
                        "make_adam(module, hparams) so that they get a group of their own"
                    )

    def modreg_layers(self) -> list[tuple[str, nn.Module]]:
        """The weight-masked layers of the model being trained, named featurizer.* / classifier.*.

        (Not `mask_layers`: DMG names its own neuron-masked layers so, and DMG+ModReg has both.)
        """
        return masked_layers(nn.ModuleDict({"featurizer": self.featurizer, "classifier": self.classifier}))

    def regularization(self, module: nn.Module | None = None) -> torch.Tensor | float:
        """X's regularization terms plus alpha * S1 + beta * S2 of `module`'s mask logits (default: the network)."""
        terms = super().regularization(module)  # type: ignore[misc]
        logits = [layer.mask_logits for _, layer in masked_layers(module if module is not None else self.network)]  # type: ignore[attr-defined]
        alpha, beta = self.penalty_weights()
        penalty, s1, s2 = ModRegPenalty.apply(alpha, beta, str(self.hparams["modreg_pi"]), *logits)
        self._last_penalties = (s1, s2)
        if not self.hparams["modreg_rescaled"]:
            # undo the division the base applies to its whole loss (1.0 where it applies none)
            penalty = penalty * getattr(self, "loss_divisor", lambda: 1.0)()
        return terms + penalty

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        self._last_penalties: tuple[torch.Tensor, torch.Tensor] | None = None
        losses = super().update(minibatches)  # type: ignore[misc]
        if self._last_penalties is None:
            raise DomaingenError(
                f"{type(self).__name__}: the base algorithm's update never added self.regularization() to its loss, "
                "so ModReg's penalty would be left out; add it to every loss it backpropagates"
            )
        s1, s2 = (float(v) for v in self._last_penalties)
        alpha, beta = self.penalty_weights()
        return {**losses, "modreg_penalty": alpha * s1 + beta * s2, "modreg_s1": s1, "modreg_s2": s2}

    def diagnostics(self) -> dict[str, Any]:
        """Per masked layer: kept-weight fraction, input features that keep any outgoing weight, and the
        mean and 10/50/90th percentiles of the keep probabilities sigmoid(l)."""
        fields: dict[str, Any] = dict(super().diagnostics())  # type: ignore[misc]
        kept = total = 0
        for name, layer in self.modreg_layers():
            stats = subnetwork_stats(layer)
            fields[f"modreg_{name}_kept_fraction"] = stats.kept_fraction
            fields[f"modreg_{name}_inputs_kept"] = stats.inputs_kept
            fields[f"modreg_{name}_inputs_total"] = stats.inputs_total
            fields[f"modreg_{name}_keep_prob_mean"] = stats.keep_prob_mean
            for q, value in stats.keep_prob_quantiles.items():
                fields[f"modreg_{name}_keep_prob_p{q}"] = value
            kept += stats.kept_fraction * layer.mask_logits.numel()
            total += layer.mask_logits.numel()
        fields["modreg_kept_fraction"] = kept / total
        return fields


    def model_diagnostics(self) -> dict[str, Any]:
        """modreg_masks: per masked layer, kept weights and input features (deterministic mask,
        sigmoid(logit) > 0.5), and the distribution of sigmoid(logit) (summary, 20-bin histogram over [0, 1])."""
        sections: dict[str, Any] = dict(super().model_diagnostics())  # type: ignore[misc]
        layers = {}
        # not self.mask_layers(): DMG's `mask_layers` attribute shadows that method in DMG+ModReg
        for name, layer in masked_layers(nn.ModuleDict({"featurizer": self.featurizer, "classifier": self.classifier})):
            stats = subnetwork_stats(layer)
            probs = torch.sigmoid(layer.mask_logits.detach().float())
            layers[name] = {
                "weights": int(probs.numel()),
                "kept_weights": int((layer.mask_logits > 0).sum()),
                "kept_fraction": stats.kept_fraction,
                "inputs_kept": stats.inputs_kept,
                "inputs_total": stats.inputs_total,
                **{f"sigmoid_{k}": v for k, v in summary(probs).items()},
                "sigmoid_histogram": histogram(probs, bins=20),
            }
        sections["modreg_masks"] = layers
        return sections


def with_modreg(base: type[Algorithm]) -> type[Algorithm]:
    """The class `BASE+ModReg`: ModRegMixin in front of `base` in the MRO."""
    if base.NO_ADDITIVE_PENALTY:
        raise DomaingenError(f"ModReg cannot be composed with {base.__name__}: {base.NO_ADDITIVE_PENALTY}")
    if not issubclass(base, FeaturizerClassifier):
        raise DomaingenError(
            f"ModReg needs an algorithm built on FeaturizerClassifier (a featurizer and a classifier); "
            f"{base.__name__} is not"
        )
    return type(f"{base.__name__}ModReg", (ModRegMixin, base), {"__doc__": f"{base.__name__} + ModReg weight masks."})


ALGORITHMS.register_modifier(MODIFIER, with_modreg)
