"""Tiny image datasets on disk, in the real layouts, for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image


def write_image(path: Path, rng: np.random.Generator, size: int = 32, fmt: str = "JPEG") -> None:
    """A random RGB image of size x size pixels."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, fmt)


def make_folder_tree(
    root: Path, domains: Sequence[str], classes: Sequence[str], per_class: int = 3, size: int = 32, seed: int = 0
) -> Path:
    """root/<domain>/<class>/<i>.jpg, `per_class` random images each; returns root."""
    rng = np.random.default_rng(seed)
    for domain in domains:
        for name in classes:
            for i in range(per_class):
                write_image(root / domain / name / f"{domain}_{name}_{i}.jpg", rng, size)
    return root
