"""FeatureContamination: a synthetic dataset with known core and background subspaces.

Zhang, Zhao, Chen, Jiang & Chen, "Feature contamination: neural networks learn uncorrelated
features and fail to generalize" (ICML 2024), Definition 3.1 and appendix F.1, with the
parameters of the paper's public code (github.com/trzhang0116/feature-contamination, `toy.py`,
read where the text leaves values out):

- an orthogonal feature dictionary M: (CORE_DIM + BACKGROUND_DIM) orthonormal rows in R^DIM
  (the code's 32 + 32 features in 256 dimensions), drawn once from DATA_SEED;
- an example is x = [z_core, z_background] @ M, with no noise (as in the code);
- core coefficients carry the label in every environment. CORE = "radial" (the code's default
  `nonlinear=True`; `FeatureContamination`): z_core uniform on the sphere of radius 1
  (class 1) or 2 (class 0), a label no linear network can fit. CORE = "sign" (the code's
  `nonlinear=False`, the linearly separable case of the theory;
  `FeatureContaminationSeparable`): class 1 has z_core ~ U[0, 1]^d, class 0 has -U[0, 1]^d;
- background coefficients are independent of the label; their distribution is what
  changes between environments. At shift strength s in [0, 1], z_background ~ U[-s, 1 - s]^d:
  s = 0 is the code's training distribution U[0, 1], s = 1 its test distribution U[-1, 0].

The environments (the ones a run trains on and the one a table holds out) are
TRAIN_SHIFTS; the shifted test distributions PROBE_SHIFTS are not environments but fixed
probe sets, evaluated at every checkpoint by `checkpoint_metrics` (fields `fc_acc_s<s>`,
`fc_risk_s<s>`): the dose-response of OOD accuracy in the shift, beside the weight
projections onto the core and background subspaces (the paper's measure, see
`subspace_projections`). The probe sets draw fresh core coefficients (the code reuses the
training ones); s = 0 is the in-distribution probe.

The setting of the paper's theorem (Section 4) is a choice of hyperparameters, beside the
paper-code setting (trained head, cross-entropy) that stays the default: `fc_fixed_head` fixes
TwoLayer's output layer to +-1/m per hidden neuron (the first half of the neurons class 1's, the
rest class 0's) and leaves it untrained, `fc_loss` picks the logistic or the hinge loss on one
output logit, with `full_batch`, `optimizer = "sgd"`, `sgd_momentum = 0` and `weight_decay`
(`sweeps/contamination_theorem.toml`). Only ERM reads them; another algorithm is refused.

Why the probes are not held-out environments: a table's column is a run holding out that
one environment and training on all the others, so shifted environments would be trained
on in every column but one; the paper's experiment trains on in-distribution data only.

Every parameter is a class constant, part of the dataset cache's key and of `data_source`;
change them in a plugin subclass (`class Wider(FeatureContamination): DIM = 512`).
Inconsistent constants are refused in one line before a run writes anything. Sizes: 1,000
examples per environment (the code's n) and per probe; built in a few milliseconds.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Mapping, Sequence

import torch
import torch.nn.functional as F

from domaingen.datasets.base import DATASETS, Environment, MultiDomainDataset
from domaingen.errors import DomaingenError
from domaingen.hparams import LOSSES, HParam, int_pow2_uniform, log_uniform, loss_name

CORE_KINDS = ("sign", "radial")
FIELD_PREFIX = "fc_"

CONTAMINATION_HPARAMS: dict[str, HParam] = {
    "lr": HParam(1e-3, log_uniform(-4.5, -2.5), "learning rate (the paper's code: 1e-3)"),
    "batch_size": HParam(64, int_pow2_uniform(3, 9), "examples per training environment per step"),
    "full_batch": HParam(False, help="every step uses every training example once (the paper's code: true)"),
    "weight_decay": HParam(0.0, help="optimizer weight decay (the paper's code: 1e-3)"),
    "optimizer": HParam("adam", help="adam (the protocol's), adamw (the paper's code's default) or sgd"),
    "sgd_momentum": HParam(0.9, help="momentum of the sgd optimizer (the paper's code: 0.9)"),
    "featurizer": HParam("TwoLayer", help="TwoLayer (the paper's network: one hidden layer), MLP, or auto"),
    "activation": HParam("relu", help="TwoLayer's activation: relu, gelu, tanh, sigmoid, identity (linear)"),
    "mlp_width": HParam(256, help="hidden width (the paper's code: 256)"),
    "mlp_depth": HParam(3, help="MLP featurizer depth (linear layers), when featurizer is MLP"),
    "mlp_dropout": HParam(0.0, help="MLP featurizer dropout, when featurizer is MLP"),
    "fc_fixed_head": HParam(False, help="the theorem's output layer: TwoLayer's head fixed to +-1/m per neuron "
                                        "(half the neurons per class), not trained (ERM only)"),
    "fc_loss": HParam("cross_entropy", help="cross_entropy (the paper's code), or logistic or hinge on one output "
                                            "logit (the theorem's; ERM only)"),
}


def shift_label(shift: float) -> str:
    """'0', '0.25', '1': how a shift strength appears in environment and field names."""
    return f"{shift:g}"


def orthogonal_dictionary(n_features: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """`n_features` orthonormal rows in R^dim (Q of a Gaussian matrix's QR, signs fixed)."""
    gaussian = torch.randn(dim, n_features, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    q = q * torch.sign(torch.diagonal(r))  # unique QR: the dictionary depends on the seed only
    return q.T.contiguous().float()


def core_coefficients(labels: torch.Tensor, dim: int, kind: str, generator: torch.Generator) -> torch.Tensor:
    """Core coefficients of examples with `labels` (0/1): see the module docstring."""
    n = len(labels)
    if kind == "sign":
        magnitude = torch.rand(n, dim, generator=generator)
        return magnitude * (2.0 * labels.float() - 1.0).unsqueeze(1)
    direction = torch.randn(n, dim, generator=generator)
    direction = direction / direction.norm(dim=1, keepdim=True)
    return direction * (2.0 - labels.float()).unsqueeze(1)


def background_coefficients(n: int, dim: int, shift: float, generator: torch.Generator) -> torch.Tensor:
    """z_background ~ U[-shift, 1 - shift]^dim, independent of the label."""
    return torch.rand(n, dim, generator=generator) - shift


class FeatureContaminationBase(MultiDomainDataset):
    """Core features carry the label, background features shift between environments (see module)."""

    DIM: ClassVar[int] = 256
    CORE_DIM: ClassVar[int] = 32
    BACKGROUND_DIM: ClassVar[int] = 32
    CORE: ClassVar[str] = "radial"
    TRAIN_SHIFTS: ClassVar[tuple[float, ...]] = (0.0, 0.1, 0.2)
    PROBE_SHIFTS: ClassVar[tuple[float, ...]] = (0.0, 0.25, 0.5, 0.75, 1.0)
    N_PER_ENV: ClassVar[int] = 1000
    N_PROBE: ClassVar[int] = 1000
    DATA_SEED: ClassVar[int] = 0
    READS_DATA_DIR = False
    NUM_CLASSES = 2
    N_STEPS = 2001
    CHECKPOINT_FREQ = 100
    HPARAMS = CONTAMINATION_HPARAMS
    # DomainBed's algorithm hyperparameters for its small, fast datasets (MNIST's)
    HPARAM_GROUPS = ("small_images",)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "ENVIRONMENTS" not in cls.__dict__:
            cls.ENVIRONMENTS = tuple(f"s={shift_label(s)}" for s in cls.TRAIN_SHIFTS)
        if "INPUT_SHAPE" not in cls.__dict__:
            cls.INPUT_SHAPE = (cls.DIM,)

    @classmethod
    def check_parameters(cls) -> None:
        """Refuse inconsistent class constants in one line that says which to change."""
        name = cls.__name__
        for key in ("DIM", "CORE_DIM", "BACKGROUND_DIM", "N_PER_ENV", "N_PROBE"):
            if int(getattr(cls, key)) < 1:
                raise DomaingenError(f"{name}.{key} must be a positive integer, got {getattr(cls, key)}")
        if cls.CORE_DIM + cls.BACKGROUND_DIM > cls.DIM:
            raise DomaingenError(
                f"{name} has {cls.CORE_DIM} core + {cls.BACKGROUND_DIM} background features, more than its "
                f"dimension DIM={cls.DIM}; orthogonal features need CORE_DIM + BACKGROUND_DIM <= DIM")
        if cls.CORE not in CORE_KINDS:
            raise DomaingenError(f"{name}.CORE must be one of {', '.join(CORE_KINDS)}, got {cls.CORE!r}")
        if len(cls.TRAIN_SHIFTS) < 2:
            raise DomaingenError(f"{name}.TRAIN_SHIFTS needs at least 2 shift strengths (one to hold out), "
                                 f"got {tuple(cls.TRAIN_SHIFTS)}")
        if len(cls.ENVIRONMENTS) != len(cls.TRAIN_SHIFTS):
            raise DomaingenError(f"{name} names {len(cls.ENVIRONMENTS)} ENVIRONMENTS for {len(cls.TRAIN_SHIFTS)} "
                                 "TRAIN_SHIFTS; give one name per shift")
        for key in ("TRAIN_SHIFTS", "PROBE_SHIFTS"):
            bad = [s for s in getattr(cls, key) if not (isinstance(s, (int, float)) and 0.0 <= s <= 1.0)]
            if bad:
                raise DomaingenError(f"{name}.{key} holds {bad}: a shift strength must be in [0, 1] "
                                     "(0: background U[0, 1], 1: U[-1, 0])")

    @classmethod
    def resolve_test_envs(cls, tokens: Sequence[int | str]) -> list[int]:
        cls.check_parameters()
        return super().resolve_test_envs(tokens)

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any], algorithm: str) -> None:
        """Refuse, in one line, an unknown `fc_loss`, a fixed head on another featurizer than TwoLayer
        or narrower than 2, and the theorem's setting (`fc_loss`, `fc_fixed_head`) with another
        algorithm than ERM, whose objective is the only one that reads them."""
        if loss_name(hparams) not in LOSSES:
            raise DomaingenError(f"unknown fc_loss '{hparams.get('fc_loss')}'; valid losses: {', '.join(LOSSES)}")
        fixed = hparams.get("fc_fixed_head", False)
        if not isinstance(fixed, bool):
            raise DomaingenError(f"fc_fixed_head must be true or false, got {fixed!r}")
        featurizer = str(hparams.get("featurizer", "TwoLayer"))
        if fixed and featurizer != "TwoLayer":
            raise DomaingenError(f"fc_fixed_head fixes TwoLayer's output layer, but the featurizer is {featurizer}; "
                                 "set featurizer TwoLayer or fc_fixed_head false")
        if fixed and int(hparams.get("mlp_width", 256)) < 2:
            raise DomaingenError(f"fc_fixed_head gives each class half the hidden neurons, but mlp_width is "
                                 f"{hparams.get('mlp_width')}; set mlp_width 2 or more")
        if (fixed or loss_name(hparams) != "cross_entropy") and algorithm != "ERM":
            raise DomaingenError(f"fc_loss and fc_fixed_head set the theorem's setting for ERM only, but the algorithm "
                                 f"is {algorithm}; use ERM or leave fc_loss cross_entropy and fc_fixed_head false")

    @classmethod
    def describe(cls) -> str:
        """The generator and its parameters (the `data_source` of every record)."""
        shifts = ",".join(shift_label(s) for s in cls.TRAIN_SHIFTS)
        probes = ",".join(shift_label(s) for s in cls.PROBE_SHIFTS)
        return (f"feature-contamination(dim={cls.DIM},core={cls.CORE_DIM}:{cls.CORE},background={cls.BACKGROUND_DIM},"
                f"shifts={shifts},probes={probes},n={cls.N_PER_ENV},seed={cls.DATA_SEED})")

    def __init__(self, data_dir: str, test_envs: Sequence[int], hparams: Mapping[str, Any]) -> None:
        super().__init__(data_dir, test_envs, hparams)
        self.check_parameters()
        self.data_source = self.describe()
        self.dictionary = orthogonal_dictionary(self.CORE_DIM + self.BACKGROUND_DIM, self.DIM,
                                                torch.Generator().manual_seed(self.DATA_SEED))
        for i, (name, shift) in enumerate(zip(self.ENVIRONMENTS, self.TRAIN_SHIFTS)):
            x, y = self.sample(self.N_PER_ENV, shift, self.DATA_SEED * 1000 + i + 1)
            env = Environment(str(name), x, y, scale=1.0)
            self.environments.append(env)
        self.probes = {shift: self.sample(self.N_PROBE, shift, self.DATA_SEED * 1000 + 500 + j)
                       for j, shift in enumerate(self.PROBE_SHIFTS)}

    def sample(self, n: int, shift: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`n` examples (half of each class, in random order) at background shift `shift`."""
        generator = torch.Generator().manual_seed(seed)
        labels = (torch.arange(n) < n // 2).long()[torch.randperm(n, generator=generator)]
        z = torch.cat([core_coefficients(labels, self.CORE_DIM, self.CORE, generator),
                       background_coefficients(n, self.BACKGROUND_DIM, shift, generator)], dim=1)
        return z @ self.dictionary, labels

    @property
    def core_basis(self) -> torch.Tensor:
        """The core features: CORE_DIM orthonormal rows of R^DIM."""
        return self.dictionary[: self.CORE_DIM]

    @property
    def background_basis(self) -> torch.Tensor:
        """The background features: BACKGROUND_DIM orthonormal rows of R^DIM."""
        return self.dictionary[self.CORE_DIM:]

    def checkpoint_metrics(self, model: torch.nn.Module, device: torch.device) -> dict[str, float]:
        """Per checkpoint: first-layer projections onto both subspaces, and risk and accuracy on every probe.

        Fields (prefix `fc_`): `core_projection`, `background_projection`, their
        `projection_ratio` (background / core), `id_risk` and `ood_risk` (cross-entropy on the
        probe at the smallest and the largest shift), and per probe shift s, `risk_s<s>` and
        `acc_s<s>`. A model without a linear layer reading the DIM inputs gets no projections.
        On the smallest shift's probe, Theorem 4.1's class-activation asymmetry
        (`class_asymmetry_fields`): `activation_own` and `activation_other`, a hidden neuron's
        mean activation on the class its output weight favours and on the other class (averaged
        over neurons), `activation_asymmetry` (own - other) and `slope_asymmetry` (the same for
        the activation's slope); only for a TwoLayer featurizer with a linear head.
        """
        fields: dict[str, float] = {}
        weight = first_layer_weight(model, self.DIM)
        if weight is not None:
            core, background = subspace_projections(weight, self.core_basis, self.background_basis)
            fields.update(core_projection=core, background_projection=background,
                          projection_ratio=background / core if core > 0 else math.inf)
        if self.PROBE_SHIFTS:
            x, y = self.probes[min(self.PROBE_SHIFTS)]
            fields.update(class_asymmetry_fields(model, x, y, device))
        risks = {}
        for shift, (x, y) in self.probes.items():
            risk, acc = probe_risk(model, x, y, device)
            risks[shift] = risk
            fields[f"risk_s{shift_label(shift)}"] = risk
            fields[f"acc_s{shift_label(shift)}"] = acc
        if risks:
            fields["id_risk"] = risks[min(risks)]
            fields["ood_risk"] = risks[max(risks)]
        return {FIELD_PREFIX + k: float(v) for k, v in fields.items()}


@DATASETS.register("FeatureContamination")
class FeatureContamination(FeatureContaminationBase):
    """Synthetic: radial core features carry the label, background features shift (Zhang et al., ICML 2024)."""


@DATASETS.register("FeatureContaminationSeparable")
class FeatureContaminationSeparable(FeatureContaminationBase):
    """FeatureContamination with linearly separable (sign) core features: a linear network learns it too."""

    CORE = "sign"


def first_layer_weight(model: torch.nn.Module, n_inputs: int) -> torch.Tensor | None:
    """The weight [hidden, n_inputs] of the first nn.Linear (in module order) that reads `n_inputs`
    features, as the evaluation forward pass uses it, or None. A weight-masked layer (ModReg's, with
    `mask_logits`) counts the weights its evaluation mask 1[logit > 0] keeps."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.in_features == n_inputs:
            weight = module.weight.detach()
            logits = getattr(module, "mask_logits", None)
            if isinstance(logits, torch.Tensor) and logits.shape == weight.shape:
                weight = weight * (logits.detach() > 0)
            return weight.float().cpu()
    return None


def neuron_classes(head: torch.nn.Module, width: int) -> torch.Tensor | None:
    """Per hidden neuron, the class its output weight favours (1 or 0; -1 for a zero weight), read
    from a linear `head` on `width` features: one logit, the sign of its weight; two logits, the
    sign of w_1 - w_0. A weight-masked head counts its kept weights. None for another head."""
    if not isinstance(head, torch.nn.Linear) or head.in_features != width or head.out_features not in (1, 2):
        return None
    weight = head.weight.detach().float()
    logits = getattr(head, "mask_logits", None)
    if isinstance(logits, torch.Tensor) and logits.shape == weight.shape:
        weight = weight * (logits.detach() > 0)
    favour = weight[0] if head.out_features == 1 else weight[1] - weight[0]
    return torch.where(favour > 0, 1, torch.where(favour < 0, 0, -1)).cpu()


def is_two_layer(module: Any) -> bool:
    """Whether `module` is shaped as the TwoLayer featurizer: `flatten`, a linear `hidden` layer, an
    activation `act`, `n_outputs` (read by shape, as datasets import no network code)."""
    return (isinstance(module, torch.nn.Module) and isinstance(getattr(module, "hidden", None), torch.nn.Linear)
            and isinstance(getattr(module, "act", None), torch.nn.Module)
            and isinstance(getattr(module, "flatten", None), torch.nn.Module)
            and getattr(module, "n_outputs", None) == module.hidden.out_features)


def hidden_with_slopes(layer: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(activations, slopes) of TwoLayer's hidden neurons on x: sigma(h) and sigma'(h) at the
    pre-activation h (the slope by autograd of the elementwise activation), both [examples, neurons]."""
    with torch.no_grad():
        pre = layer.hidden(layer.flatten(x))
    with torch.enable_grad():
        pre = pre.detach().requires_grad_(True)
        out = layer.act(pre)
        slope = torch.autograd.grad(out.sum(), pre)[0] if out.requires_grad else torch.ones_like(pre)
    return out.detach(), slope.detach()


def activation_by_class(hidden: torch.Tensor, labels: torch.Tensor, classes: torch.Tensor) -> tuple[float, float]:
    """(own, other): over neurons j with a class c_j (not -1), the mean of neuron j's activation over
    the examples of class c_j, and over the examples of the other class; `hidden` is [examples, neurons]."""
    hidden = hidden.double()
    mean = {c: hidden[labels == c].mean(0) for c in (0, 1)}
    kept = classes >= 0
    own = torch.where(classes == 1, mean[1], mean[0])[kept]
    other = torch.where(classes == 1, mean[0], mean[1])[kept]
    return float(own.mean()), float(other.mean())


def class_asymmetry_fields(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                           device: torch.device) -> dict[str, float]:
    """Theorem 4.1's class-activation asymmetry of the model's TwoLayer neurons on (x, y), neurons
    classed by its linear head (`neuron_classes`), in eval mode; {} for another model.

    `activation_own`, `activation_other` (`activation_by_class` of sigma(h)) and
    `activation_asymmetry` = own - other; `slope_asymmetry`: the same difference for sigma'(h),
    the factor by which an example enters its neuron's gradient. The background gradient of a
    neuron is, up to its output weight, the background mean times this slope difference, so it
    is 0 for the linear network (slope 1 on both classes) whatever its activation asymmetry.
    """
    featurizer, head = getattr(model, "featurizer", None), getattr(model, "classifier", None)
    if not is_two_layer(featurizer):
        return {}
    classes = neuron_classes(head, featurizer.n_outputs)
    if classes is None or not bool((classes >= 0).any()):
        return {}
    was_training = model.training
    model.eval()
    try:
        hidden, slope = hidden_with_slopes(featurizer, x.to(device))
    finally:
        model.train(was_training)
    own, other = activation_by_class(hidden.float().cpu(), y, classes)
    slope_own, slope_other = activation_by_class(slope.float().cpu(), y, classes)
    return {"activation_own": own, "activation_other": other, "activation_asymmetry": own - other,
            "slope_asymmetry": slope_own - slope_other}


def subspace_projections(weight: torch.Tensor, core: torch.Tensor, background: torch.Tensor) -> tuple[float, float]:
    """The paper's measure (its code's `corr_core`, `corr_spu`): per hidden neuron, the norm of its
    weight vector's projection onto each subspace (orthonormal rows), averaged over neurons."""
    return (float((weight @ core.T).norm(dim=1).mean()), float((weight @ background.T).norm(dim=1).mean()))


def probe_risk(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of `model.predict` on (x, y), in eval mode, without gradients.

    A one-logit model's risk is the logistic loss of that logit (class 1 when it is > 0).
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model.predict(x.to(device)).float().cpu()
    finally:
        model.train(was_training)
    if logits.shape[1] == 1:
        logit = logits[:, 0]
        risk = F.binary_cross_entropy_with_logits(logit, y.float())
        return float(risk), float(((logit > 0).long() == y).float().mean())
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())
