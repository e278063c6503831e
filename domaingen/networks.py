"""Featurizers (MLP, MNIST_CNN) and classifier heads, and device selection."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from domaingen.errors import DomaingenError


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> CUDA when present, else CPU; any other torch device string as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DomaingenError(f"unknown device '{name}'; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DomaingenError(f"device '{name}' asked for, but CUDA is not available; use --device auto or cpu")
    return device


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move a batch to `device`; image batches go channels-last, which oneDNN and cuDNN convolve faster."""
    if x.dim() == 4:
        return x.to(device, memory_format=torch.channels_last, non_blocking=True)
    return x.to(device, non_blocking=True)


def place_model(model: nn.Module, device: torch.device, input_shape: Sequence[int]) -> nn.Module:
    """Move a model to `device`, channels-last when its inputs are images (matching `to_device`).

    A model whose `prefers_channels_last` attribute is False stays contiguous (NCHW).
    """
    if len(input_shape) == 3 and getattr(model, "prefers_channels_last", True):
        return model.to(device, memory_format=torch.channels_last)
    return model.to(device)


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


FEATURIZERS = ("MNIST_CNN", "MLP", "IRM_MLP")


def build_featurizer(input_shape: Sequence[int], hparams: Mapping[str, Any]) -> nn.Module:
    """The featurizer named by hparams['featurizer'], or chosen from the input shape for 'auto'.

    The result has an `n_outputs` attribute, the width of its features.
    """
    name = hparams.get("featurizer", "auto")
    if name == "auto":
        name = "MLP" if len(input_shape) == 1 else "MNIST_CNN"
    if name == "MLP":
        width = int(hparams.get("mlp_width", 256))
        return MLP(
            math.prod(input_shape), width, width, int(hparams.get("mlp_depth", 3)), float(hparams.get("mlp_dropout", 0.0))
        )
    if name == "IRM_MLP":
        return IRMPaperMLP(math.prod(input_shape), int(hparams.get("mlp_width", 256)))
    if name == "MNIST_CNN":
        if len(input_shape) != 3:
            raise DomaingenError(f"MNIST_CNN needs image inputs (C, H, W), got shape {tuple(input_shape)}")
        return MNIST_CNN(input_shape)
    raise DomaingenError(f"unknown featurizer '{name}'; valid featurizers: auto, {', '.join(FEATURIZERS)}")


def build_classifier(n_features: int, num_classes: int, single_logit: bool = False, init: str = "default") -> nn.Linear:
    """A linear classifier head; a binary task may use one logit (class 1 when it is > 0).

    `init` is "default" (torch's) or "xavier" (Xavier-uniform weights, zero bias).
    """
    if single_logit and num_classes != 2:
        raise DomaingenError(f"single_logit needs a binary task, but there are {num_classes} classes")
    head = nn.Linear(n_features, 1 if single_logit else num_classes)
    if init == "xavier":
        _xavier(head)
    return head
