"""Shared fixtures: real MNIST (skipped when absent) and small, fast run settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from domaingen.datasets.mnist import MNIST_FILES

# A small MLP keeps every end-to-end run to seconds on two CPU cores.
FAST_HPARAMS = {"featurizer": "MLP", "mlp_width": 32, "batch_size": 16}


def _mnist_root() -> Path | None:
    root = os.environ.get("DOMAINGEN_DATA")
    if not root:
        return None
    raw = Path(root) / "MNIST" / "raw"
    if all((raw / f).exists() or (raw / f"{f}.gz").exists() for f in MNIST_FILES):
        return Path(root)
    return None


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The directory holding MNIST/raw, from DOMAINGEN_DATA; skips the test without it."""
    root = _mnist_root()
    if root is None:
        pytest.skip("real MNIST not found: set DOMAINGEN_DATA to a directory holding MNIST/raw")
    return root
