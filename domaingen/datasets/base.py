"""Multi-domain datasets: an ordered list of named environments."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Mapping, Sequence

import torch

from domaingen.datasets.environment import Environment
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam
from domaingen.registry import Registry

if TYPE_CHECKING:
    from domaingen.datasets.splits import Split

DATASETS: Registry[type["MultiDomainDataset"]] = Registry("dataset")

# ImageNet channel statistics: the normalisation of every image dataset's inputs
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

EMBEDDED = "embedded"


def resolve_data_dir(data_dir: str | os.PathLike | None) -> str:
    """--data_dir, else $DOMAINGEN_DATA, else ./data. 'embedded' is kept as is."""
    if data_dir:
        return str(data_dir)
    return os.environ.get("DOMAINGEN_DATA") or "./data"


class MultiDomainDataset:
    """Base class of every dataset: `environments` in the order of ENVIRONMENTS.

    Subclasses set the class attributes below and fill `self.environments`.
    `data_source` says where the examples came from, and is written into
    every results record.
    """

    ENVIRONMENTS: ClassVar[Sequence[str]] = ()
    INPUT_SHAPE: ClassVar[tuple[int, ...]] = ()
    NUM_CLASSES: ClassVar[int] = 0
    # the classes' names in label order, for prompts (folder datasets read theirs from the class folders)
    CLASS_NAMES: ClassVar[tuple[str, ...]] = ()
    N_STEPS: ClassVar[int] = 5001
    CHECKPOINT_FREQ: ClassVar[int] = 100
    HPARAMS: ClassVar[dict[str, HParam]] = {}
    # groups an algorithm's dataset-dependent hyperparameters can name (hparams.by_dataset);
    # "small_images" is DomainBed's group of 28x28 digit datasets
    HPARAM_GROUPS: ClassVar[tuple[str, ...]] = ()
    # Set (on a per-run subclass, see `built_as_domainbed`) under the domainbed protocol: build the
    # dataset as DomainBed's run with this seed would. MNIST datasets draw their environments from it;
    # image datasets evaluate training environments through the training augmentation.
    DOMAINBED_SEED: ClassVar[int | None] = None
    # False for a dataset built in memory, which never reads data_dir
    READS_DATA_DIR: ClassVar[bool] = True

    def __init__(self, data_dir: str, test_envs: Sequence[int], hparams: Mapping[str, Any]) -> None:
        self.data_dir = data_dir
        self.test_envs = list(test_envs)
        self.hparams = dict(hparams)
        self.environments: list[Environment] = []
        self.data_source = "unknown"
        # the step of the checkpoint being evaluated (the training loop sets it before each evaluation)
        self.eval_round = 0
        # under DOMAINBED_SEED: the state DomainBed's global generator is left in by building this
        # dataset (None where DomainBed's dataset draws nothing from it, as for image folders)
        self.domainbed_rng_state: torch.Tensor | None = None

    @classmethod
    def built_as_domainbed(cls, seed: int) -> type["MultiDomainDataset"]:
        """This dataset class with DOMAINBED_SEED set: a subclass of the same name, module and registry entry."""
        variant = type(cls.__name__, (cls,), {"DOMAINBED_SEED": int(seed)})
        variant.__module__, variant.__qualname__ = cls.__module__, cls.__qualname__
        return variant

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.INPUT_SHAPE)

    @property
    def num_classes(self) -> int:
        return self.NUM_CLASSES

    @property
    def class_names(self) -> list[str] | None:
        """The classes' names in label order: the class folders of a folder dataset, else CLASS_NAMES; None when
        the dataset has none."""
        names = getattr(self, "classes", None) or self.CLASS_NAMES
        return list(names) if names else None

    def __len__(self) -> int:
        return len(self.environments)

    def __getitem__(self, index: int) -> Environment:
        return self.environments[index]

    def minibatch_sampler(self, splits: Sequence["Split"], batch_size: int, seed: int, device: torch.device) -> Any:
        """The training batches: an object with next() -> [(x, y) per split], state() and load_state().

        In-memory datasets draw by index (MinibatchSampler; every example each step with
        the `full_batch` hparam); image datasets override this with DataLoader workers.
        """
        from domaingen.datasets.sampling import MinibatchSampler

        full_batch = bool(self.hparams.get("full_batch", False))
        return MinibatchSampler(splits, batch_size, seed, device, full_batch)

    def use_image_cache(self, cache_dir: Path) -> bool:
        """Read images from a decoded-image cache in `cache_dir` (the `image_cache` run setting); False
        where the dataset has none (tensors in memory; image datasets with an augmentation of their own)."""
        return False

    def eval_batches(self, split: "Split", batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(x, y) batches of every example of `split`, in order, for evaluation."""
        for start in range(0, len(split), batch_size):
            yield split.batch(slice(start, start + batch_size))

    def environment_metrics(self, env_index: int, index: torch.Tensor, predicted: torch.Tensor) -> dict[str, float]:
        """Extra record fields from the predicted labels of environment `env_index`'s examples
        at `index` (in and out splits together); none by default (WILDS' official metrics use it)."""
        return {}

    def checkpoint_metrics(self, model: torch.nn.Module, device: torch.device) -> dict[str, float]:
        """Extra record fields measured on the model at each checkpoint (the algorithm, in its
        training state; the hook must leave it so); none by default (FeatureContamination's
        weight projections and probe risks use it)."""
        return {}

    @classmethod
    def hparam_space(cls) -> dict[str, HParam]:
        """Hyperparameters the dataset fixes for every algorithm (lr, batch size, network)."""
        space: dict[str, HParam] = {}
        for klass in reversed(cls.__mro__):
            space.update(getattr(klass, "HPARAMS", {}) or {})
        return space

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any], algorithm: str) -> None:
        """Raise DomaingenError for dataset hyperparameter values a run of `algorithm` cannot use
        (called before a run writes anything, and when a sweep spec is read); nothing by default."""

    @classmethod
    def environment_index(cls, token: int | str) -> int:
        """The index of one environment given by index (2, "2") or by name ("-90%", any case).

        An integer is an index; one that is out of range but names an environment
        (RotatedMNIST's "15") is that environment; an index that names a different
        environment is refused as ambiguous. check_test_envs checks the range.
        """
        names = [str(name) for name in cls.ENVIRONMENTS]
        listing = ", ".join(f"{i}={name}" for i, name in enumerate(names))
        text = str(token).strip()
        try:
            index = int(text)
        except ValueError:
            index = None
        named = names.index(text) if text in names else None
        if index is not None:
            if named is not None and named != index and 0 <= index < len(names):
                raise DomaingenError(f"test environment {text} of {cls.__name__} is ambiguous: index {index} is "
                                     f"{names[index]!r} but {text!r} names environment {named} ({listing})")
            return named if named is not None and not 0 <= index < len(names) else index
        if named is None:
            folded = [i for i, name in enumerate(names) if name.casefold() == text.casefold()]
            named = folded[0] if len(folded) == 1 else None
        if named is None:
            raise DomaingenError(f"unknown test environment {text!r} of {cls.__name__}; give an index or a name: {listing}")
        return named

    @classmethod
    def resolve_test_envs(cls, tokens: Sequence[int | str]) -> list[int]:
        """Indices or names -> sorted, checked indices (see environment_index, check_test_envs)."""
        test_envs = sorted(cls.environment_index(t) for t in tokens)
        cls.check_test_envs(test_envs)
        return test_envs

    @classmethod
    def check_test_envs(cls, test_envs: Sequence[int]) -> None:
        """Raise a clear error for out-of-range or duplicate test environments."""
        n = len(cls.ENVIRONMENTS)
        listing = ", ".join(f"{i}={name}" for i, name in enumerate(cls.ENVIRONMENTS))
        for env in test_envs:
            if not 0 <= env < n:
                raise DomaingenError(
                    f"test environment {env} is out of range for {cls.__name__}, "
                    f"which has {n} environments ({listing})"
                )
        if len(set(test_envs)) != len(test_envs):
            raise DomaingenError(f"test environments repeat: {list(test_envs)}")
        if len(test_envs) >= n:
            raise DomaingenError(
                f"holding out {len(test_envs)} of {n} environments of {cls.__name__} leaves none to train on"
            )


def check_data_dir(data_dir: str | os.PathLike | None, datasets: Sequence[str], flag: str = "--data_dir") -> None:
    """Refuse, in one line, a data directory that does not exist when one of `datasets` reads it."""
    readers = [name for name in datasets if DATASETS.get(name).READS_DATA_DIR]
    resolved = resolve_data_dir(data_dir)
    if not readers or resolved == EMBEDDED or Path(resolved).expanduser().is_dir():
        return
    origin = flag if data_dir else ("$DOMAINGEN_DATA" if os.environ.get("DOMAINGEN_DATA") else "the default")
    raise DomaingenError(
        f"data directory {resolved} ({origin}) does not exist and {', '.join(readers)} "
        f"need{'s' if len(readers) == 1 else ''} it: give {flag} "
        f"or $DOMAINGEN_DATA the directory holding the data (`domaingen download` fills one), or, for MNIST "
        f"datasets, {flag} embedded")


def data_path(data_dir: str, *parts: str) -> Path:
    """A path under the data directory."""
    return Path(data_dir).expanduser().joinpath(*parts)
