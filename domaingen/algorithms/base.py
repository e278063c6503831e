"""The algorithm contract and the pieces every algorithm shares."""

from __future__ import annotations

import copy
from typing import Any, ClassVar, Collection, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from domaingen.errors import DomaingenError
from domaingen.hparams import ONE_LOGIT_LOSSES, HParam, loss_name
from domaingen.masks.weight_masks import weight_mask_logits
from domaingen.networks import build_classifier, build_featurizer
from domaingen.registry import Registry

Minibatches = Sequence[tuple[torch.Tensor, torch.Tensor]]

ALGORITHMS: Registry[type["Algorithm"]] = Registry("algorithm")
# DomainBed's train.py evaluates every split in batches of 64 (the last one short): what a
# method whose predictions depend on the batch must use to follow its protocol
DOMAINBED_EVAL_BATCH_SIZE = 64
# why an update that declares nothing about compilation runs eagerly under --compile_step
UNCHECKED_STEP = "its update is not declared static-shape (Algorithm.EAGER_STEP)"


class Algorithm(nn.Module):
    """A domain-generalization method.

    Subclasses declare `HPARAMS` beside the class, implement `update` (one
    training step on one (x, y) minibatch per training environment, returning
    its losses) and `predict` (logits). Every torch.optim.Optimizer attribute is
    saved and restored with checkpoints automatically.
    """

    HPARAMS: ClassVar[dict[str, HParam]] = {}
    # Why the method's objective cannot take an additive penalty (a regularizer such as
    # ModReg is then refused); empty when it can.
    NO_ADDITIVE_PENALTY: ClassVar[str] = ""
    # image models run channels-last (faster oneDNN/cuDNN convolutions) unless a method opts out
    prefers_channels_last: ClassVar[bool] = True
    # Extra test-time modes that evaluation reports beside the default `predict`
    # (fields env{i}_in_acc_{mode}): mode name -> whether it needs the examples' domain index.
    EVAL_MODES: ClassVar[dict[str, bool]] = {}
    # Methods whose predictions depend on the evaluation batch (MTL's test-time embedding is
    # the batch's mean feature, ARM's context the mean over a support set) evaluate in batches
    # of exactly this many, never padded (DOMAINBED_EVAL_BATCH_SIZE for DomainBed's protocol);
    # None: any size (the device's default), predictions independent of it.
    EVAL_BATCH_SIZE: ClassVar[int | None] = None
    # The fewest training domains the method is defined for (methods that compare domains need 2).
    MIN_TRAIN_DOMAINS: ClassVar[int] = 1
    # Why the method is undefined for a one-logit (binary logistic) classifier; empty when it is defined.
    NO_SINGLE_LOGIT: ClassVar[str] = ""
    # Why weight averaging (X+EMA, X+SWAD) must be refused, e.g. a method that already evaluates an average.
    NO_WEIGHT_AVERAGING: ClassVar[str] = ""
    # Why the method needs the dataset's class names (`set_class_names`); empty when it does not. A run of
    # a dataset without them is refused before it writes anything.
    NEEDS_CLASS_NAMES: ClassVar[str] = ""
    # Why `update` runs eagerly under --compile_step (`eager_step_reason` says which class's counts); empty
    # when the update has static shapes and compiles to the eager result up to rounding.
    EAGER_STEP: ClassVar[str] = UNCHECKED_STEP

    def __init__(
        self, input_shape: Sequence[int], num_classes: int, num_domains: int, hparams: Mapping[str, Any]
    ) -> None:
        super().__init__()
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.num_domains = num_domains
        self.hparams = dict(hparams)

    @classmethod
    def hparam_space(cls) -> dict[str, HParam]:
        """The algorithm's own hyperparameters, its base classes' included."""
        space: dict[str, HParam] = {}
        for klass in reversed(cls.__mro__):
            space.update(klass.__dict__.get("HPARAMS", {}) or {})
        return space

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any]) -> None:
        """Raise DomaingenError for hyperparameter values the algorithm cannot use (called
        before a run creates its directory); nothing to check by default."""

    @classmethod
    def check_problem(cls, num_train_domains: int, hparams: Mapping[str, Any], name: str | None = None) -> None:
        """Raise DomaingenError when the method is undefined for this many training domains or
        for a one-logit classifier (called, like `check_hparams`, before a run writes anything)."""
        name = name or cls.__name__
        if num_train_domains < cls.MIN_TRAIN_DOMAINS:
            raise DomaingenError(
                f"{name} needs at least {cls.MIN_TRAIN_DOMAINS} training domains, got {num_train_domains}; "
                "hold out fewer environments"
            )
        if cls.NO_SINGLE_LOGIT and hparams.get("single_logit"):
            raise DomaingenError(f"{name} is undefined for a one-logit classifier: {cls.NO_SINGLE_LOGIT}")

    @classmethod
    def fit_hparams(
        cls, hparams: Mapping[str, Any], num_train_domains: int, explicit: Collection[str] = ()
    ) -> dict[str, Any]:
        """The hyperparameters a run uses, given how many training domains it has.

        A drawn or default value the method cannot use with this many domains may be
        adapted here (the run records the value it used); a value the user set
        (`explicit`) is left for `check_problem` to refuse. Unchanged by default.
        """
        return dict(hparams)

    def set_class_names(self, names: Sequence[str]) -> None:
        """Receive the dataset's class names, in label order (a run calls it before training when the
        dataset has them); ignored by default."""

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        """One training step; returns named scalar losses (at least 'loss')."""
        raise NotImplementedError

    def predict(self, x: torch.Tensor, domain: int | torch.Tensor | None = None) -> torch.Tensor:
        """Logits for `x`. `domain` is used only by domain-aware methods."""
        raise NotImplementedError

    def predict_mode(self, x: torch.Tensor, mode: str, domain: int | torch.Tensor | None = None) -> torch.Tensor:
        """Logits for `x` in one of `EVAL_MODES`; `domain` is the training-domain index for modes that need it."""
        raise DomaingenError(f"{type(self).__name__} has no test-time mode '{mode}'")

    def predict_modes(
        self, x: torch.Tensor, modes: Sequence[str | None], domain: int | torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Logits for `x` in each of `modes` (None: the default `predict`), as evaluation asks for
        them: every mode of one batch at once. By default one call per mode; a method whose modes
        share work (MultiHead's heads share one featurizer pass) overrides it, with the same logits."""
        return [self.predict(x) if mode is None else self.predict_mode(x, mode, domain) for mode in modes]

    def diagnostics(self) -> dict[str, Any]:
        """Extra fields written into every results record (e.g. mask statistics); none by default."""
        return {}

    # --- hooks of `domaingen diagnose` (a new algorithm gets sensible defaults) ---

    def activation_layers(self) -> dict[str, nn.Module]:
        """The modules whose outputs are post-nonlinearity activations, by name (for neuron statistics).

        Default: the featurizer's own `activation_modules()` when it has one, else every nn.ReLU
        under `featurizer` (or the whole model without one); in a
        torchvision ResNet, whose ReLU modules run several times per block, the outputs of
        layer1..layer4 (each block ends in a ReLU).
        """
        root, prefix = (self.featurizer, "featurizer.") if isinstance(getattr(self, "featurizer", None), nn.Module) else (self, "")
        declared = getattr(root, "activation_modules", None)
        if callable(declared):  # a featurizer that names its activations (TwoLayer, whose activation is a choice)
            return {prefix + name: m for name, m in declared().items()}
        resnet = getattr(root, "resnet", None)
        if isinstance(resnet, nn.Module) and all(hasattr(resnet, f"layer{i}") for i in range(1, 5)):
            return {f"{prefix}resnet.layer{i}": getattr(resnet, f"layer{i}") for i in range(1, 5)}
        return {prefix + name: m for name, m in root.named_modules() if isinstance(m, nn.ReLU)}

    def activation_forward(self, x: torch.Tensor) -> torch.Tensor:
        """One forward pass over `x` (one row per example) during which activations are recorded; `predict` by default."""
        return self.predict(x)

    def model_diagnostics(self) -> dict[str, Any]:
        """Algorithm-specific sections of `domaingen diagnose` (JSON-ready), keyed by section name.

        A section maps a layer name to a dict of fields; scalar fields are printed in the
        summary, lists (matrices, histograms) go to diagnostics.json and the report.
        None by default.
        """
        return {}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The optimizers this algorithm holds, by attribute name."""
        return {k: v for k, v in vars(self).items() if isinstance(v, torch.optim.Optimizer)}

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything needed to resume training exactly: weights, buffers, optimizer states."""
        return {
            "model": self.state_dict(),
            "optimizers": {name: opt.state_dict() for name, opt in self.optimizers().items()},
        }

    def load_checkpoint_state(self, state: Mapping[str, Any]) -> None:
        """Restore what `checkpoint_state` saved."""
        self.load_state_dict(state["model"])
        current = self.optimizers()
        for name, opt_state in state["optimizers"].items():
            # torch keeps the given tensors when device and dtype already match; copy so
            # that two algorithms never share (and both update) one Adam state
            current[name].load_state_dict(copy.deepcopy(opt_state))


# the hyperparameter that sets the learning rate of weight-mask logits (declared by ModReg)
MASK_LR_KEY = "modreg_mask_lr"


def parameter_groups(module: nn.Module, hparams: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`module`'s parameters as optimizer groups: the weights, then (if it has any) the
    weight-mask logits in a group of their own, with learning rate `modreg_mask_lr`
    (default: the run's lr) and no weight decay: mask logits are not weights.
    """
    mask_ids = {id(p) for p in weight_mask_logits(module)}
    groups: list[dict[str, Any]] = [{"params": [p for p in module.parameters() if id(p) not in mask_ids]}]
    if mask_ids:
        groups.append({
            "params": [p for p in module.parameters() if id(p) in mask_ids],
            "lr": float(hparams.get(MASK_LR_KEY, hparams["lr"])),
            "weight_decay": 0.0,
        })
    return groups


OPTIMIZERS = ("adam", "adamw", "sgd")


def check_optimizer(hparams: Mapping[str, Any]) -> None:
    """Refuse an unknown `optimizer` hyperparameter in one line (before a run writes anything)."""
    name = str(hparams.get("optimizer", "adam")).lower()
    if name not in OPTIMIZERS:
        raise DomaingenError(f"unknown optimizer '{hparams.get('optimizer')}'; valid optimizers: {', '.join(OPTIMIZERS)}")


def make_adam(params, hparams: Mapping[str, Any], lr: float | None = None) -> torch.optim.Optimizer:
    """The run's optimizer with its lr and weight decay: Adam, the protocol's, unless the
    `optimizer` hyperparameter (declared by FeatureContamination) says `adamw` or `sgd`
    (momentum `sgd_momentum`, default 0.9): the settings of Zhang et al.'s code.

    `params` is what torch.optim takes, or an nn.Module, whose parameters are then
    grouped by `parameter_groups` (mask logits apart). Build every optimizer over a
    model from the module, so that `X+ModReg`'s masks get their own learning rate.
    DANN's and URM's discriminators keep their own Adam (their betas are DomainBed's).
    """
    if isinstance(params, nn.Module):
        params = parameter_groups(params, hparams)
    check_optimizer(hparams)
    lr = hparams["lr"] if lr is None else lr
    decay = hparams.get("weight_decay", 0.0)
    name = str(hparams.get("optimizer", "adam")).lower()
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=float(hparams.get("sgd_momentum", 0.9)), weight_decay=decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=decay)
    return torch.optim.Adam(params, lr=lr, weight_decay=decay)


def eager_step_reason(cls: type[Algorithm]) -> str:
    """Why `cls`'s update must run eagerly under --compile_step; '' when it may be compiled.

    Read from the nearest class (in the MRO) that declares EAGER_STEP or defines `update`, so a
    subclass or a modifier (X+ModReg, X+EMA) that overrides `update` is eager until it declares
    its own EAGER_STEP, and a subclass can refuse the update it inherits (MMD from CORAL's).
    """
    for klass in cls.__mro__:
        if "EAGER_STEP" in vars(klass) or "update" in vars(klass):
            return str(vars(klass).get("EAGER_STEP", UNCHECKED_STEP))
    return UNCHECKED_STEP


class FeaturizerClassifier(Algorithm):
    """An algorithm whose model is featurizer -> linear classifier, trained by Adam."""

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.featurizer = build_featurizer(self.input_shape, self.hparams)
        self.classifier = build_classifier(
            self.featurizer.n_outputs,
            num_classes,
            single_logit=bool(self.hparams.get("single_logit", False)) or loss_name(self.hparams) in ONE_LOGIT_LOSSES,
            init=getattr(self.featurizer, "head_init", "default"),
            included=bool(getattr(self.featurizer, "includes_head", False)),
        )
        self.prepare_modules()
        self.network = nn.Sequential(self.featurizer, self.classifier)
        self.optimizer = make_adam(self.network, self.hparams)

    def prepare_modules(self) -> None:
        """Adapt `featurizer` and `classifier` before the network and its optimizer are built.

        A no-op here; regularizers that change layers (ModReg's weight masks) override it.
        """

    def predict(self, x: torch.Tensor, domain: int | torch.Tensor | None = None) -> torch.Tensor:
        return self.network(x)

    def classification_objective(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean loss the run's `fc_loss` hyperparameter names (`binary_loss`); without one,
        `classification_loss`."""
        return binary_loss(logits, y, loss_name(self.hparams))

    def l2_penalty(self, module: nn.Module | None = None) -> torch.Tensor | float:
        """l2_weight * the squared norm of `module`'s weights and biases (default: the network).

        The explicit L2 term of the IRM paper's protocol (`l2_weight` hparam, 0 elsewhere);
        unlike Adam's weight decay it is part of the loss, so loss rescaling scales it too.
        Mask logits are not weights and are left out.
        """
        weight = float(self.hparams.get("l2_weight", 0.0))
        if not weight:
            return 0.0
        params = [p for name, p in (module or self.network).named_parameters() if "mask_logits" not in name]
        return weight * sum(p.square().sum() for p in params)

    def regularization(self, module: nn.Module | None = None) -> torch.Tensor | float:
        """The terms every loss this algorithm backpropagates must include, added before
        the algorithm rescales that loss or edits its gradients.

        Here the L2 term; a regularizer composed with the algorithm (ModReg) adds its own
        penalty by overriding this method, so every algorithm that computes its losses
        as `loss + self.regularization(module)` gets it in its objective. `module` is the
        model the loss trains (default: the network; Fish: its inner clone).
        """
        return self.l2_penalty(module)

    def step(self, loss: torch.Tensor) -> None:
        """Add the regularization terms to `loss`, backpropagate, and take one optimizer step."""
        self.apply_gradients(loss + self.regularization())

    def apply_gradients(self, loss: torch.Tensor) -> None:
        """Backpropagate `loss` as it is and take one optimizer step."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def classification_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; a single logit column is a binary classifier (logistic loss)."""
    if logits.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(logits[:, 0], y.to(logits.dtype))
    return F.cross_entropy(logits, y)


def binary_loss(logits: torch.Tensor, y: torch.Tensor, name: str = "cross_entropy") -> torch.Tensor:
    """Mean loss `name` of `logits` against labels y. hinge: mean max(0, 1 - (2y - 1) z) of the one
    logit z; logistic and cross_entropy: `classification_loss` (logistic for one logit column)."""
    if name == "hinge":
        if logits.shape[1] != 1:
            raise DomaingenError(f"the hinge loss reads one logit, got {logits.shape[1]}; set fc_loss hinge before "
                                 "the model is built")
        margin = (2.0 * y.to(logits.dtype) - 1.0) * logits[:, 0]
        return (1.0 - margin).clamp(min=0).mean()
    return classification_loss(logits, y)


def concat(minibatches: Minibatches) -> tuple[torch.Tensor, torch.Tensor]:
    """All environments' examples as one batch."""
    return torch.cat([x for x, _ in minibatches]), torch.cat([y for _, y in minibatches])


def split_by_env(logits: torch.Tensor, minibatches: Minibatches) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(logits, labels) per environment, from one forward pass over the concatenated minibatches."""
    labels = [y for _, y in minibatches]
    return list(zip(torch.split(logits, [len(y) for y in labels]), labels))


def environment_gradients(
    algorithm: FeaturizerClassifier, minibatches: Minibatches
) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, ...]], float]:
    """(trainable parameters, each environment's gradient of its loss + the regularization terms,
    the sum of the environments' losses): what gradient-masking methods (ANDMask, SANDMask) combine.
    The regularization enters every environment's gradient, so a mask sees it too."""
    params = [p for p in algorithm.network.parameters() if p.requires_grad]
    per_env: list[tuple[torch.Tensor, ...]] = []
    total = 0.0
    for x, y in minibatches:
        loss = classification_loss(algorithm.predict(x), y)
        per_env.append(torch.autograd.grad(loss + algorithm.regularization(), params))
        total += loss.item()
    return params, per_env, total
