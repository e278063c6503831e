"""Devices: choosing one ('auto' = CUDA when present) and placing batches and models on it.

Below both the networks and the datasets: data code moves batches with `to_device` without
importing model code.
"""

from __future__ import annotations

import os
from typing import Sequence

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


# cuBLAS is deterministic only with a fixed workspace (CUDA's documented setting)
CUBLAS_WORKSPACE = ":4096:8"


def make_deterministic(device: torch.device) -> None:
    """On CUDA, deterministic cuDNN and torch's deterministic algorithms, as DomainBed's train.py sets cuDNN.

    So a resumed run writes the records of an uninterrupted one on a GPU too. `warn_only`: an
    operation without a deterministic CUDA kernel warns (its name in the log) instead of
    failing; such a run may differ in the last bits between a resumed and an uninterrupted
    pass. A no-op on a CPU, whose kernels are deterministic already.
    """
    if device.type != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)


CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def has_convolutions(model: nn.Module) -> bool:
    """Whether `model` convolves (else its image inputs are only flattened: an MLP)."""
    return any(isinstance(m, CONVOLUTIONS) for m in model.modules())


def to_device(x: torch.Tensor, device: torch.device, channels_last: bool = True) -> torch.Tensor:
    """Move a batch to `device`; image batches go channels-last, which oneDNN and cuDNN convolve faster.

    `channels_last` False keeps them contiguous: a network without convolutions flattens
    its input, which for a channels-last batch is one more copy, after the one into it.
    """
    if x.dim() == 4 and channels_last:
        return x.to(device, memory_format=torch.channels_last, non_blocking=True)
    return x.to(device, non_blocking=True)


def place_model(model: nn.Module, device: torch.device, input_shape: Sequence[int]) -> nn.Module:
    """Move a model to `device`, channels-last when its inputs are images (matching `to_device`).

    A model whose `prefers_channels_last` attribute is False stays contiguous (NCHW).
    """
    if len(input_shape) == 3 and getattr(model, "prefers_channels_last", True):
        return model.to(device, memory_format=torch.channels_last)
    return model.to(device)
