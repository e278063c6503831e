"""Which GPUs a machine shows, and which worker runs on which (pure functions, plus one probe)."""

from __future__ import annotations

import os
from typing import Sequence

from domaingen.errors import DomaingenError

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def visible_gpus(env_value: str | None, device_count: int) -> list[str]:
    """The GPU ids a child process may be pinned to with CUDA_VISIBLE_DEVICES.

    `env_value` is this process's CUDA_VISIBLE_DEVICES (None: unset, every GPU
    by index); its entries (indices or GPU-UUIDs) are kept as written, up to the
    `device_count` CUDA reports, and CUDA's own rule applies: the list ends at
    the first empty entry.
    """
    if env_value is None:
        return [str(i) for i in range(device_count)]
    entries = []
    for entry in env_value.split(","):
        entry = entry.strip()
        if not entry:
            break
        entries.append(entry)
    return entries[:device_count]


def worker_gpus(gpus: Sequence[str], jobs_per_gpu: int, n_jobs: int) -> list[str]:
    """The GPU of each worker: `jobs_per_gpu` workers per GPU, dealt round-robin.

    Dealing round-robin spreads a short job list over every GPU before any GPU
    gets a second worker; there are never more workers than jobs.
    """
    if jobs_per_gpu < 1:
        raise DomaingenError(f"--jobs_per_gpu must be at least 1, got {jobs_per_gpu}")
    slots = [gpu for _ in range(jobs_per_gpu) for gpu in gpus]
    return slots[: max(0, n_jobs)]


def detect_gpus() -> list[str]:
    """The GPUs this process sees ([] without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return visible_gpus(os.environ.get(CUDA_VISIBLE_DEVICES), torch.cuda.device_count())
