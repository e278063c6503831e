"""Featurizers (MLP, MNIST_CNN, torchvision ResNets, timm models, DigitMLP: networks/digits.py) and classifier heads.

The image backbone is the `backbone` hyperparameter (see `backbone_of`): `resnet18` and
`resnet50` (torchvision, ImageNet V1 weights: the 2021 protocol, the default),
`resnet50_augmix` (timm's AugMix ResNet-50, DomainBed HEAD's default), `dinov2` (DomainBed's
DINOv2 ViT-B/14 features), `timm:NAME` for any timm model (`networks/timm_models.py`), or
`clip:MODEL[:TAG]` for the image tower of an open_clip model (`networks/clip_models.py`).
DomainBed HEAD's boolean names (`resnet18`, `resnet50_augmix`, `vit` with `dinov2`,
`vit_attn_tune`) choose the same backbones, so its `--hparams` work unchanged.

The device helpers (`resolve_device`, `to_device`, `place_model`, `has_convolutions`) live in
`domaingen.devices`, which data code imports too; they are importable from here as well.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from domaingen.devices import CONVOLUTIONS, has_convolutions, place_model, resolve_device, to_device  # noqa: F401
from domaingen.errors import DomaingenError
from domaingen.networks import clip_models, timm_models
from domaingen.registry import Registry

log = logging.getLogger(__name__)


class MLP(nn.Module):
    """Flatten, then `depth` linear layers with dropout and ReLU between them (DomainBed's MLP)."""

    def __init__(self, n_inputs: int, n_outputs: int, width: int, depth: int, dropout: float) -> None:
        super().__init__()
        if depth < 2:
            raise DomaingenError(f"mlp_depth must be at least 2, got {depth}")
        layers: list[nn.Module] = [nn.Flatten()]
        sizes = [n_inputs] + [width] * (depth - 1)
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(fan_in, fan_out), nn.Dropout(dropout), nn.ReLU()]
        layers.append(nn.Linear(width, n_outputs))
        self.layers = nn.Sequential(*layers)
        self.n_outputs = n_outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class MNIST_CNN(nn.Module):
    """Four 3x3 convolutions (64, 128 stride 2, 128, 128), each ReLU + GroupNorm(8), global mean pool."""

    n_outputs = 128

    def __init__(self, input_shape: Sequence[int]) -> None:
        super().__init__()
        channels = [input_shape[0], 64, 128, 128, 128]
        strides = [1, 2, 1, 1]
        layers: list[nn.Module] = []
        for c_in, c_out, stride in zip(channels[:-1], channels[1:], strides):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1), nn.ReLU(), nn.GroupNorm(8, c_out)]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).mean(dim=(2, 3))


class IRMPaperMLP(nn.Module):
    """The IRM paper's Colored MNIST network without its last layer: Linear, ReLU, Linear, ReLU.

    Weights Xavier-uniform, biases zero, as in that paper; `head_init` asks the
    classifier head for the same initialisation.
    """

    head_init = "xavier"

    def __init__(self, n_inputs: int, width: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(n_inputs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        for layer in self.layers:
            if isinstance(layer, nn.Linear):
                _xavier(layer)
        self.n_outputs = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _xavier(layer: nn.Linear) -> None:
    nn.init.xavier_uniform_(layer.weight)
    nn.init.zeros_(layer.bias)


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "identity": nn.Identity,
}


def check_activation(name: Any) -> str:
    """The activation's name in lower case; raises a one-line error for an unknown one."""
    key = str(name).strip().lower()
    if key not in ACTIVATIONS:
        raise DomaingenError(f"unknown activation '{name}'; valid activations: {', '.join(ACTIVATIONS)}")
    return key


class TwoLayer(nn.Module):
    """Flatten, Linear(n_inputs, width), activation: with the classifier head, the two-layer network
    of Zhang et al. (ICML 2024), whose code uses torch's default initialisation.

    `identity` is the paper's linear ablation. The activation module is `act`; its outputs
    are what `diagnose` reads (`activation_layers`).
    """

    def __init__(self, n_inputs: int, width: int, activation: str = "relu") -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.hidden = nn.Linear(n_inputs, width)
        self.act = ACTIVATIONS[check_activation(activation)]()
        self.n_outputs = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.hidden(self.flatten(x)))

    def activation_modules(self) -> dict[str, nn.Module]:
        """The module whose outputs are the hidden activations, whatever the activation (for `diagnose`)."""
        return {"act": self.act}


RESNETS = ("resnet18", "resnet50")
WEIGHTS_ENV = "DOMAINGEN_WEIGHTS"
DEFAULT_BACKBONE = "resnet50"
TIMM_PREFIX = "timm:"
# named backbones served by timm (DomainBed HEAD's), and the timm model behind each
TIMM_NAMED = {"resnet50_augmix": timm_models.AUGMIX_RESNET50, "dinov2": timm_models.DINOV2_VITB14}
BACKBONES = RESNETS + tuple(TIMM_NAMED)
# DomainBed HEAD's boolean hyperparameters that choose a backbone, in its order of precedence
DOMAINBED_FLAGS = ("resnet50_augmix", "resnet18")


def as_bool(value: Any, name: str) -> bool:
    """A bool-ish hyperparameter: true/false, 1/0, yes/no (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise DomaingenError(f"hyperparameter '{name}' must be true or false, got {value!r}")


def backbone_of(hparams: Mapping[str, Any]) -> str | None:
    """The backbone a run's hyperparameters choose, None when they name none (MNIST-sized data).

    DomainBed HEAD's flags win over `backbone` as in its networks.py: `vit` with `dinov2` ->
    dinov2, else `resnet50_augmix` -> resnet50_augmix, else `resnet18` -> resnet18. A flag
    that names another backbone than an explicitly set `backbone` is refused, and so are
    `vit` without `dinov2` (DomainBed has no such backbone) and `dinov2` without `vit`.
    """
    given = hparams.get("backbone")
    flags = {k: as_bool(hparams.get(k, False), k) for k in ("vit", "dinov2", *DOMAINBED_FLAGS)}
    if flags["vit"] != flags["dinov2"]:
        raise DomaingenError("DomainBed's only ViT backbone is DINOv2: set vit and dinov2 both true (or both false), "
                             "or choose a ViT with backbone timm:NAME")
    implied = "dinov2" if flags["vit"] else next((k for k in DOMAINBED_FLAGS if flags[k]), None)
    if implied is None:
        return None if given is None else str(given)
    if given not in (None, DEFAULT_BACKBONE, implied):
        raise DomaingenError(f"backbone '{given}' and the DomainBed flag(s) set true ({implied}) name two backbones; "
                             "set one of them")
    return implied


def check_backbone(hparams: Mapping[str, Any], input_shape: Sequence[int] | None = None) -> None:
    """Refuse, before a run writes anything, a backbone that cannot be built: an unknown name,
    timm missing for a timm backbone, or $DOMAINGEN_WEIGHTS holding no file that fits it; and an
    unknown `activation` (TwoLayer's)."""
    if "activation" in hparams:
        check_activation(hparams["activation"])
    backbone = backbone_of(hparams)
    if clip_models.is_clip(backbone):
        clip_models.check_weights(backbone, as_bool(hparams.get("pretrained", True), "pretrained"))
        return
    if backbone is None or backbone in RESNETS:
        if backbone is not None and as_bool(hparams.get("vit_attn_tune", False), "vit_attn_tune"):
            raise DomaingenError(f"vit_attn_tune trains a ViT's attention only, but the backbone is {backbone}; "
                                 "set vit_attn_tune false")
        return
    name = timm_name(backbone)
    timm_models.check_model_name(name)
    if as_bool(hparams.get("pretrained", True), "pretrained"):
        size = int(hparams.get("image_size", 224))
        timm_models.check_weights(name, tuple(input_shape) if input_shape else (3, size, size))


def timm_name(backbone: str) -> str:
    """The timm model of a timm-served backbone (`timm:NAME` or a named one); raises for any other name."""
    if backbone.startswith(TIMM_PREFIX) and len(backbone) > len(TIMM_PREFIX):
        return backbone[len(TIMM_PREFIX):]
    if backbone in TIMM_NAMED:
        return TIMM_NAMED[backbone]
    raise DomaingenError(f"unknown backbone '{backbone}'; valid backbones: {', '.join(BACKBONES)}, "
                         "timm:NAME for any timm model, or clip:MODEL[:TAG] for an open_clip model")


def describe_backbone(hparams: Mapping[str, Any]) -> str | None:
    """'resnet50, BatchNorm frozen' (for table captions); None when the run has no backbone.

    Reads DomainBed's own records too (their `resnet18`/`resnet50_augmix`/`freeze_bn` flags;
    a DomainBed 2021 record has no `freeze_bn`: its ResNet always froze BatchNorm).
    """
    try:
        backbone = backbone_of(hparams)
        if backbone is None and "resnet_dropout" in hparams:  # DomainBed 2021: the ResNet-50 unless resnet18
            backbone = DEFAULT_BACKBONE
        if backbone is None:
            return None
        frozen = as_bool(hparams.get("freeze_bn", True), "freeze_bn")
    except DomaingenError:
        return None
    return f"{backbone}, BatchNorm {'frozen' if frozen else 'updating'}"


def imagenet_weights_file(backbone: str) -> Path:
    """Where torchvision keeps the ImageNet (IMAGENET1K_V1) weights of `backbone`: the torch hub cache."""
    import torchvision

    url = torchvision.models.get_model_weights(backbone).IMAGENET1K_V1.url
    return Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]


def load_imagenet_weights(backbone: str) -> dict[str, torch.Tensor]:
    """ImageNet weights of `backbone`: from $DOMAINGEN_WEIGHTS (a file, or a folder holding
    torchvision's file), else the torch hub cache, else downloaded into that cache.

    Raises DomaingenError saying where to put the file, or how to train without it.
    """
    import torchvision

    weights = torchvision.models.get_model_weights(backbone).IMAGENET1K_V1
    name = weights.url.rsplit("/", 1)[-1]
    given = os.environ.get(WEIGHTS_ENV)
    if given:
        path = Path(given).expanduser()
        path = path / name if path.is_dir() else path
        if not path.is_file():
            raise DomaingenError(f"${WEIGHTS_ENV} is {given}, but {path} is not a file; put {name} ({weights.url}) there")
        return torch.load(path, map_location="cpu", weights_only=True)
    cached = imagenet_weights_file(backbone)
    if cached.is_file():
        return torch.load(cached, map_location="cpu", weights_only=True)
    log.info("ImageNet weights of %s not in %s; downloading %s", backbone, cached.parent, weights.url)
    try:
        return weights.get_state_dict(progress=False)
    except Exception as exc:  # offline, proxy, disk: the user's fix is the same
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise DomaingenError(
            f"ImageNet weights of {backbone} not found and could not be downloaded ({reason}); "
            f"put {name} ({weights.url}) in {cached.parent} or point ${WEIGHTS_ENV} at it, "
            """or train from random initialisation with --hparams '{"pretrained": false}'"""
        ) from None


class ResNet(nn.Module):
    """A torchvision ResNet without its last layer, then dropout (DomainBed's featurizer).

    `resnet` is the torchvision model with `fc` replaced by Identity, so its blocks keep
    their names (`resnet.layer3`, `resnet.layer4`). With `freeze_bn` the BatchNorm
    layers stay in eval mode (running statistics frozen; their affine weights still
    train), as in the 2021 protocol.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        backbone: str = "resnet50",
        pretrained: bool = True,
        freeze_bn: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        import torchvision

        if backbone not in RESNETS:
            raise DomaingenError(f"unknown backbone '{backbone}'; valid backbones: {', '.join(BACKBONES)}, "
                                 "or timm:NAME for any timm model")
        self.resnet = getattr(torchvision.models, backbone)(weights=None)
        if pretrained:
            self.resnet.load_state_dict(load_imagenet_weights(backbone))
        else:
            log.warning(
                "%s starts from random initialisation (pretrained=false); accuracies are not "
                "comparable with the published ImageNet-pretrained numbers",
                backbone,
            )
        if input_shape[0] != 3:
            self._adapt_input_channels(int(input_shape[0]))
        self.n_outputs = self.resnet.fc.in_features
        self.resnet.fc = nn.Identity()
        self.dropout = nn.Dropout(dropout)
        self.freeze_bn = freeze_bn
        self.train()

    def _adapt_input_channels(self, channels: int) -> None:
        # cycle the RGB filters over the new channels so pretrained filters stay useful
        old = self.resnet.conv1
        new = nn.Conv2d(channels, old.out_channels, old.kernel_size, old.stride, old.padding, bias=False)
        with torch.no_grad():
            for c in range(channels):
                new.weight[:, c] = old.weight[:, c % 3]
        self.resnet.conv1 = new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.resnet(x))

    def train(self, mode: bool = True) -> "ResNet":
        super().train(mode)
        if self.freeze_bn:
            for module in self.resnet.modules():
                if isinstance(module, nn.BatchNorm2d):
                    module.eval()
        return self


Featurizer = Callable[[Sequence[int], Mapping[str, Any]], nn.Module]

# name -> a builder (input_shape, hparams) -> module with an `n_outputs` attribute; a class
# whose __init__ takes (input_shape, hparams) is a builder. Plugins register their own.
FEATURIZERS: Registry[Featurizer] = Registry("featurizer")


def _needs_images(name: str, input_shape: Sequence[int]) -> None:
    if len(input_shape) != 3:
        raise DomaingenError(f"{name} needs image inputs (C, H, W), got shape {tuple(input_shape)}")


@FEATURIZERS.register("MNIST_CNN")
def _mnist_cnn(input_shape: Sequence[int], hparams: Mapping[str, Any]) -> nn.Module:
    _needs_images("MNIST_CNN", input_shape)
    return MNIST_CNN(input_shape)


@FEATURIZERS.register("MLP")
def _mlp(input_shape: Sequence[int], hparams: Mapping[str, Any]) -> nn.Module:
    width = int(hparams.get("mlp_width", 256))
    return MLP(math.prod(input_shape), width, width, int(hparams.get("mlp_depth", 3)), float(hparams.get("mlp_dropout", 0.0)))


@FEATURIZERS.register("TwoLayer")
def _two_layer(input_shape: Sequence[int], hparams: Mapping[str, Any]) -> nn.Module:
    module = TwoLayer(math.prod(input_shape), int(hparams.get("mlp_width", 256)), str(hparams.get("activation", "relu")))
    if as_bool(hparams.get("fc_fixed_head", False), "fc_fixed_head"):
        module.head_init = "fixed"  # the theorem's output layer: fixed +-1/m, not trained
    return module


@FEATURIZERS.register("DigitMLP")
def _digit_mlp(input_shape: Sequence[int], hparams: Mapping[str, Any]) -> nn.Module:
    from domaingen.networks.digits import build_digit_mlp

    return build_digit_mlp(input_shape, hparams)


@FEATURIZERS.register("IRM_MLP")
def _irm_mlp(input_shape: Sequence[int], hparams: Mapping[str, Any]) -> nn.Module:
    return IRMPaperMLP(math.prod(input_shape), int(hparams.get("mlp_width", 256)))


@FEATURIZERS.register("ResNet")
def _resnet(input_shape: Sequence[int], hparams: Mapping[str, Any]) -> nn.Module:
    _needs_images("ResNet", input_shape)
    return ResNet(
        input_shape,
        backbone=backbone_of(hparams) or DEFAULT_BACKBONE,
        pretrained=as_bool(hparams.get("pretrained", True), "pretrained"),
        freeze_bn=as_bool(hparams.get("freeze_bn", True), "freeze_bn"),
        dropout=float(hparams.get("resnet_dropout", 0.0)),
    )


@FEATURIZERS.register("clip")
def _clip(input_shape: Sequence[int], hparams: Mapping[str, Any]) -> nn.Module:
    backbone = backbone_of(hparams)
    if not clip_models.is_clip(backbone):
        raise DomaingenError(f"featurizer 'clip' needs a backbone clip:MODEL[:TAG] (e.g. clip:ViT-B-32), got {backbone!r}")
    return clip_models.CLIPFeaturizer(input_shape, backbone,
                                      pretrained=as_bool(hparams.get("pretrained", True), "pretrained"))


@FEATURIZERS.register("timm")
def _timm(input_shape: Sequence[int], hparams: Mapping[str, Any]) -> nn.Module:
    _needs_images("a timm backbone", input_shape)
    backbone = backbone_of(hparams) or "timm:"
    return timm_models.TimmFeaturizer(
        input_shape,
        timm_name(backbone),
        pretrained=as_bool(hparams.get("pretrained", True), "pretrained"),
        freeze_bn=as_bool(hparams.get("freeze_bn", True), "freeze_bn"),
        resnet_dropout=float(hparams.get("resnet_dropout", 0.0)),
        vit_dropout=float(hparams.get("vit_dropout", 0.0)),
        features="dinov2" if backbone == "dinov2" else "pooled",
        attn_only=as_bool(hparams.get("vit_attn_tune", False), "vit_attn_tune"),
    )


def build_featurizer(input_shape: Sequence[int], hparams: Mapping[str, Any]) -> nn.Module:
    """The featurizer named by hparams['featurizer'] (a name in FEATURIZERS), or chosen for 'auto'.

    'auto' picks the backbone `backbone_of(hparams)` names when there is one (a torchvision
    ResNet for resnet18/resnet50, the timm featurizer for the others), else an MLP for flat
    inputs and MNIST_CNN for images. The result has an `n_outputs` attribute, the width of
    its features.
    """
    name = hparams.get("featurizer", "auto")
    if name == "auto":
        backbone = backbone_of(hparams)
        if backbone is not None:
            name = "ResNet" if backbone in RESNETS else "clip" if clip_models.is_clip(backbone) else "timm"
        else:
            name = "MLP" if len(input_shape) == 1 else "MNIST_CNN"
    if name not in FEATURIZERS:
        raise DomaingenError(f"unknown featurizer '{name}'; valid featurizers: auto, {', '.join(FEATURIZERS.names())}")
    module = FEATURIZERS.get(name)(tuple(input_shape), hparams)
    if not isinstance(getattr(module, "n_outputs", None), int):
        raise DomaingenError(f"featurizer '{name}' ({FEATURIZERS.owners()[name]}) built a module without an integer "
                             "`n_outputs` attribute (the width of its features); set one")
    return module


def build_classifier(n_features: int, num_classes: int, single_logit: bool = False, init: str = "default",
                     included: bool = False) -> nn.Module:
    """A linear classifier head; a binary task may use one logit (class 1 when it is > 0).

    `init` is "default" (torch's), "xavier" (Xavier-uniform weights, zero bias) or "fixed" (the
    untrained output layer of Zhang et al.'s theorem, `fix_theorem_head`). `included`:
    the featurizer ends in its own head (`includes_head`, DigitMLP), whose `n_features` outputs
    are the class scores; the head is then the identity.
    """
    if included:
        if n_features != num_classes:
            raise DomaingenError(f"the featurizer ends in its own head of {n_features} outputs, but the dataset has "
                                 f"{num_classes} classes; use a featurizer that fits the dataset")
        return nn.Identity()
    if single_logit and num_classes != 2:
        raise DomaingenError(f"single_logit needs a binary task, but there are {num_classes} classes")
    head = nn.Linear(n_features, 1 if single_logit else num_classes)
    if init == "xavier":
        _xavier(head)
    if init == "fixed":
        fix_theorem_head(head)
    return head


def theorem_head_signs(width: int) -> torch.Tensor:
    """Each hidden neuron's output sign in the theorem's fixed head: +1 for the first ceil(width / 2)
    neurons (class 1's), -1 for the others (class 0's)."""
    signs = -torch.ones(width)
    signs[: (width + 1) // 2] = 1.0
    return signs


def fix_theorem_head(head: nn.Linear) -> None:
    """Set `head` to the fixed output layer of Zhang et al.'s theorem and exclude it from training.

    Neuron j's output weight is a_j = sign_j / m (m the width, signs from `theorem_head_signs`),
    the bias is 0. One logit: the logit is sum_j a_j h_j. Two logits (cross-entropy): class c's
    logit sums 1/m times class c's neurons, so logit_1 - logit_0 is the same sum.
    """
    if head.out_features not in (1, 2):
        raise DomaingenError(f"the theorem's fixed output layer is binary, but the head has {head.out_features} "
                             "outputs; use a two-class dataset")
    signs = theorem_head_signs(head.in_features)
    scale = 1.0 / head.in_features
    with torch.no_grad():
        if head.out_features == 1:
            head.weight.copy_(scale * signs.unsqueeze(0))
        else:
            head.weight.copy_(scale * torch.stack([(signs < 0).float(), (signs > 0).float()]))
        head.bias.zero_()
    head.requires_grad_(False)


# --- context networks (ARM): x -> a per-example context, averaged over a support set ---


class ARM_CNN(nn.Module):
    """Three 5x5 same-size convolutions (C -> 64 -> 64 -> 1), BatchNorm + ReLU after the first two:
    a one-channel context image of the input's height and width (DomainBed's ARM context network)."""

    def __init__(self, input_shape: Sequence[int], hidden: int = 64) -> None:
        super().__init__()
        channels = [input_shape[0], hidden, hidden]
        layers: list[nn.Module] = []
        for c_in, c_out in zip(channels[:-1], channels[1:]):
            layers += [nn.Conv2d(c_in, c_out, 5, padding=2), nn.BatchNorm2d(c_out), nn.ReLU()]
        layers.append(nn.Conv2d(hidden, 1, 5, padding=2))
        self.layers = nn.Sequential(*layers)
        self.out_channels = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class ARM_MLP(nn.Module):
    """For flat inputs: two hidden layers (BatchNorm + ReLU) and a context vector as wide as the input."""

    def __init__(self, n_inputs: int, hidden: int = 64) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(n_inputs, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, n_inputs),
        )
        self.out_channels = n_inputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x.flatten(1))


# name -> a builder (input_shape, hparams) -> module mapping a batch to per-example contexts of
# shape (batch, out_channels, *input_shape[1:]) for images, (batch, out_channels) for flat inputs;
# the module has an integer `out_channels`. Plugins register their own.
CONTEXT_NETS: Registry[Featurizer] = Registry("context network")


@CONTEXT_NETS.register("ARM_CNN")
def _arm_cnn(input_shape: Sequence[int], hparams: Mapping[str, Any]) -> nn.Module:
    _needs_images("ARM_CNN", input_shape)
    return ARM_CNN(input_shape)


@CONTEXT_NETS.register("ARM_MLP")
def _arm_mlp(input_shape: Sequence[int], hparams: Mapping[str, Any]) -> nn.Module:
    if len(input_shape) != 1:
        raise DomaingenError(f"ARM_MLP needs flat inputs, got shape {tuple(input_shape)}")
    return ARM_MLP(int(input_shape[0]))


def build_context_net(input_shape: Sequence[int], hparams: Mapping[str, Any], name: str = "auto") -> nn.Module:
    """The context network `name` (in CONTEXT_NETS); 'auto' is ARM_CNN for images, ARM_MLP for flat inputs."""
    if name == "auto":
        name = "ARM_CNN" if len(input_shape) == 3 else "ARM_MLP"
    if name not in CONTEXT_NETS:
        raise DomaingenError(f"unknown context network '{name}'; valid: auto, {', '.join(CONTEXT_NETS.names())}")
    module = CONTEXT_NETS.get(name)(tuple(input_shape), hparams)
    if not isinstance(getattr(module, "out_channels", None), int):
        raise DomaingenError(f"context network '{name}' built a module without an integer `out_channels` attribute")
    return module
