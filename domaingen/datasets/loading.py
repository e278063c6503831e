"""Datasets of image files: environments as file lists, DomainBed's transforms, DataLoader workers.

Shared by the folder datasets (PACS, DomainNet, OfficeHome, ...) and WILDS. One training DataLoader
serves every training environment (each batch holds `batch_size` examples per
environment) and one evaluation DataLoader serves every split; both keep their
worker processes for the whole run.

Reproducibility: the sampler draws, in the main process, each example's position
and a seed for its augmentation, and the example is transformed under that seed.
So the batches depend on the run's seed only, not on the number of workers, and a
resumed run (the checkpoint stores how many batches were consumed) draws exactly
the batches an uninterrupted one would.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler

from domaingen.datasets.base import IMAGENET_MEAN, IMAGENET_STD, MultiDomainDataset
from domaingen.datasets.image_cache import ImageCache, open_image_cache
from domaingen.datasets.splits import Split
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, choice, int_pow2_uniform, log_uniform, seed_hash
from domaingen.devices import to_device

log = logging.getLogger(__name__)

MAX_AUTO_WORKERS = 8
MAX_POOLED_BATCHES = 8  # CachedExamples: one per environment of a step, for the steps whose batches are still held

RESNET_HPARAMS: dict[str, HParam] = {
    "lr": HParam(5e-5, log_uniform(-5, -3.5), "Adam learning rate"),
    "batch_size": HParam(32, int_pow2_uniform(3, 5.5), "examples per training environment per step"),
    "weight_decay": HParam(0.0, log_uniform(-6, -2), "Adam weight decay"),
    "resnet_dropout": HParam(0.0, choice([0.0, 0.1, 0.5]), "dropout on the features of a convolutional backbone"),
    "vit_dropout": HParam(0.0, choice([0.0, 0.1, 0.5]), "dropout on the features of a ViT backbone (DomainBed's name)"),
    "featurizer": HParam("auto", help="auto (the backbone's), ResNet, timm, MNIST_CNN or MLP"),
    "backbone": HParam("resnet50", help="resnet18 or resnet50 (torchvision), resnet50_augmix, dinov2, timm:NAME, "
                                        "or clip:MODEL[:TAG] (open_clip)"),
    "resnet18": HParam(False, help="DomainBed's flag: true = backbone resnet18"),
    "resnet50_augmix": HParam(False, help="DomainBed HEAD's flag: true = timm's AugMix ResNet-50 (resnet50.ram_in1k)"),
    "vit": HParam(False, help="DomainBed HEAD's flag: with dinov2, the DINOv2 ViT-B/14 backbone"),
    "dinov2": HParam(False, help="DomainBed HEAD's flag: with vit, the DINOv2 ViT-B/14 backbone"),
    "vit_attn_tune": HParam(False, help="train a ViT backbone's attention parameters only (DomainBed's name)"),
    "pretrained": HParam(True, help="start from ImageNet weights (hub cache or $DOMAINGEN_WEIGHTS); false = random init"),
    "freeze_bn": HParam(True, help="BatchNorm statistics frozen, as in the 2021 protocol; false = they update"),
    "image_size": HParam(224, help="side of the square network input, in pixels"),
    "num_workers": HParam("auto", help="DataLoader worker processes; auto = min(8, CPUs available)"),
}

def train_transform(size: int) -> Callable[[Image.Image], torch.Tensor]:
    """DomainBed's training augmentation at `size` pixels, ImageNet-normalised."""
    from torchvision import transforms as T

    return T.Compose([
        T.RandomResizedCrop(size, scale=(0.7, 1.0)),
        T.RandomHorizontalFlip(),
        T.ColorJitter(0.3, 0.3, 0.3, 0.3),
        T.RandomGrayscale(p=0.1),
        T.ToTensor(),
        T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def eval_transform(size: int) -> Callable[[Image.Image], torch.Tensor]:
    """DomainBed's evaluation transform: resize to size x size, ImageNet-normalised."""
    from torchvision import transforms as T

    return T.Compose([T.Resize((size, size)), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def load_rgb(path: str) -> Image.Image:
    """The image at `path`, decoded, as RGB."""
    with Image.open(path) as image:
        return image.convert("RGB")


def decoded_square(path: str, size: int) -> np.ndarray:
    """The image at `path` as the evaluation transform resizes it (Resize((size, size)) on the RGB
    image): a (size, size, 3) uint8 array, what the decoded-image cache stores."""
    from torchvision import transforms as T

    return np.asarray(T.Resize((size, size))(load_rgb(path)), dtype=np.uint8)


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which cgroups and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolve_workers(value: Any) -> int:
    """The num_workers hparam as a count: 'auto' = min(8, CPUs available); never more than the CPUs."""
    cpus = available_cpus()
    if value is None or value == "auto":
        return min(MAX_AUTO_WORKERS, cpus)
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise DomaingenError(f"hyperparameter 'num_workers' must be 'auto' or a count, got {value!r}") from None
    if count < 0:
        raise DomaingenError(f"hyperparameter 'num_workers' must be 'auto' or >= 0, got {count}")
    if count > cpus:
        log.warning("num_workers %d is more than the %d CPUs available; using %d", count, cpus, cpus)
        return cpus
    return count


@dataclass
class FileEnvironment:
    """One domain as image files and integer labels; images are read when a batch needs them."""

    name: str
    paths: list[str]
    y: torch.Tensor
    transform: Callable[[Image.Image], torch.Tensor] | None = None  # evaluation transform, for batch()
    metadata: Any = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.paths)

    def batch(self, index: torch.Tensor | slice) -> tuple[torch.Tensor, torch.Tensor]:
        """(evaluation-transformed images, labels) at `index`, read in this process."""
        positions = range(len(self))[index] if isinstance(index, slice) else index.tolist()
        transform = self.transform or eval_transform(224)
        x = torch.stack([transform(load_rgb(self.paths[p])) for p in positions])
        return x, self.y[index]


class FileExamples(Dataset):
    """Every environment's examples, keyed by (env, position, augmentation seed or None).

    A key with a seed gets the training transform under that seed, unless its environment
    is not in `augmented` (None: every environment is); None gets the evaluation transform.
    An unreadable file is replaced by the next example of its
    environment, with a warning (files are checked when the dataset is built, so this
    only happens to files damaged after their header).
    """

    def __init__(self, environments: Sequence[FileEnvironment], train_tf: Callable, eval_tf: Callable,
                 augmented: Sequence[int] | None = None) -> None:
        self.environments = list(environments)
        self.train_tf = train_tf
        self.eval_tf = eval_tf
        self.augmented = None if augmented is None else frozenset(augmented)

    def __len__(self) -> int:
        return sum(len(env) for env in self.environments)

    def load(self, env_index: int, position: int) -> Any:
        """The decoded image of example `position` of environment `env_index` (OSError if unreadable)."""
        return load_rgb(self.environments[env_index].paths[position])

    def __getitem__(self, key: tuple[int, int, int | None]) -> tuple[torch.Tensor, int]:
        image, aug_seed, label = self._example(key)
        return self._transform(image, aug_seed), label

    def _example(self, key: tuple[int, int, int | None]) -> tuple[Any, int | None, int]:
        """(decoded image, augmentation seed or None: the evaluation transform, label) of `key`; the next
        readable example of its environment where its file is unreadable."""
        env_index, position, aug_seed = key
        env = self.environments[env_index]
        for attempt in range(len(env)):
            p = (position + attempt) % len(env)
            try:
                image = self.load(env_index, p)
            except OSError as exc:
                log.warning("skipping unreadable image %s (%s); using the next one", env.paths[p], exc)
                continue
            augment = aug_seed is not None and (self.augmented is None or env_index in self.augmented)
            return image, aug_seed if augment else None, int(env.y[p])
        raise DomaingenError(f"no readable image in environment {env.name}")

    def _transform(self, image: Any, aug_seed: int | None) -> torch.Tensor:
        if aug_seed is None:
            return self.eval_tf(image)
        return seeded(self.train_tf, image, aug_seed)


def seeded(transform: Callable[[Any], torch.Tensor], image: Any, seed: int) -> torch.Tensor:
    """`transform(image)` with torch's global CPU generator seeded by `seed`, the caller's stream untouched."""
    # torchvision's random transforms use torch's global CPU generator (workers=0 runs them in the main
    # process). Only the CPU generator: torch.manual_seed also queues a CUDA seeding, with a stack trace.
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return transform(image)


class CachedExamples(FileExamples):
    """FileExamples read from a decoded-image cache: uint8 tensors at the evaluation size, through
    DomainBed's transforms on tensors (`tensor_augment`). Evaluation pixels equal the PIL path's;
    training draws the same augmentation parameters, with the departures `tensor_augment` names.

    A DataLoader batch (`__getitems__`) is written straight into channels-last batches, one per run of
    keys of one environment, which `channels_last_batches` hands on without a copy."""

    def __init__(self, environments: Sequence[FileEnvironment], cache: ImageCache, size: int,
                 augmented: Sequence[int] | None = None) -> None:
        # imported here: torchvision's import is a large share of a short MNIST job, which never uses it
        from domaingen.datasets.tensor_augment import (tensor_augmentation, tensor_eval_transform,
                                                       tensor_train_transform)

        super().__init__(environments, tensor_train_transform(size), tensor_eval_transform, augmented)
        self.augmentation = tensor_augmentation(size)  # train_tf without its normalisation
        self._batches: list[torch.Tensor] = []  # batches this process wrote, reused once nothing else holds them
        self.size = size
        self.cache = cache
        self.offsets = [0]
        for env in self.environments[:-1]:
            self.offsets.append(self.offsets[-1] + len(env))

    def _transform(self, image: torch.Tensor, aug_seed: int | None) -> torch.Tensor:
        return super()._transform(image, aug_seed).contiguous()  # the cache's images are channels last

    def __getitems__(self, keys: Sequence[tuple[int, int, int | None]]) -> list[tuple[torch.Tensor, int]]:
        """The examples of `keys`, each image a (3, S, S) slot of a channels-last float batch: one batch per
        run of consecutive keys of one environment (in shared memory inside a DataLoader worker)."""
        from domaingen.datasets.tensor_augment import normalize_into

        examples = []
        start = 0
        while start < len(keys):
            stop = start + 1
            while stop < len(keys) and keys[stop][0] == keys[start][0]:
                stop += 1
            batch = self._batch((stop - start, self.size, self.size, 3)).permute(0, 3, 1, 2)
            for slot, key in zip(batch, keys[start:stop]):
                image, aug_seed, label = self._example(key)
                if aug_seed is None:
                    slot.copy_(self.eval_tf(image))
                else:
                    normalize_into(seeded(self.augmentation, image, aug_seed), slot)
                examples.append((slot, label))
            start = stop
        return examples

    def _batch(self, shape: tuple[int, ...]) -> torch.Tensor:
        """An uninitialised float tensor of `shape`: outside DataLoader workers, one this process wrote before
        and nothing references any more, where there is one. Fresh memory of this size is mapped anew and
        page-faulted in on each write, which costs more than the images' augmentation."""
        if torch.utils.data.get_worker_info() is not None or not hasattr(torch._C, "_storage_Use_Count"):
            return _new_batch(shape, torch.float32)
        for batch in self._batches:
            # 2: the pool's tensor and the storage object of this call; a view or copy-free move adds one
            if batch.shape == shape and torch._C._storage_Use_Count(batch.untyped_storage()._cdata) == 2:
                return batch
        batch = torch.empty(shape)
        self._batches = [batch, *self._batches[:MAX_POOLED_BATCHES - 1]]
        return batch

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_batches": []}

    def collate(self, batch_size: int) -> Callable[[list], tuple[tuple[torch.Tensor, ...], torch.Tensor]]:
        """The training DataLoader's collate_fn: `channels_last_batches` of `batch_size` examples each."""
        return functools.partial(channels_last_batches, batch_size=batch_size)

    def load(self, env_index: int, position: int) -> torch.Tensor:
        index = self.offsets[env_index] + position
        if index in self.cache.unreadable:
            raise OSError("it could not be decoded when the image cache was built")
        return self.cache.image(index)


def _new_batch(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor of `shape`, in shared memory inside a DataLoader worker (as default_collate's
    batches are, so sending it to the main process copies nothing)."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    numel = int(np.prod(shape))
    storage = torch.UntypedStorage._new_shared(numel * torch.empty((), dtype=dtype).element_size())
    return torch.empty((0,), dtype=dtype).set_(storage, 0, shape)


def _whole_batch(images: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The channels-last batch whose slots are `images`, in order and all of it (None: they are not)."""
    base = images[0]._base
    if base is None or base.dim() != 4 or base.shape[0] != len(images):
        return None
    step = base.stride(0) * base.element_size()
    for i, image in enumerate(images):
        if image._base is not base or image.data_ptr() != base.data_ptr() + i * step:
            return None
    return base.permute(0, 3, 1, 2)


def channels_last_batches(examples: list[tuple[torch.Tensor, int]],
                          batch_size: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(one channels-last (batch_size, C, H, W) batch per consecutive `batch_size` examples, the labels).

    Channels last is the layout `to_device` gives image batches, so it moves them without a copy on the
    CPU. Examples that `CachedExamples.__getitems__` wrote into one such batch are that batch, not copied.
    """
    images = [x for x, _ in examples]
    batches = []
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size]
        batch = _whole_batch(chunk)
        if batch is None:
            channels, height, width = chunk[0].shape
            batch = _new_batch((len(chunk), height, width, channels), chunk[0].dtype).permute(0, 3, 1, 2)
            torch.stack(chunk, out=batch)
        batches.append(batch)
    return tuple(batches), torch.tensor([y for _, y in examples])


class InfiniteTrainingBatches(Sampler):
    """Endless batches of keys: `batch_size` examples of each training split, drawn with replacement.

    `splits` is (environment index, the split's positions in that environment) per
    training split. Batch k depends only on (seed, k); `start` skips the first batches.
    """

    def __init__(self, splits: Sequence[tuple[int, list[int]]], batch_size: int, seed: int, start: int = 0) -> None:
        self.splits = list(splits)
        self.batch_size = int(batch_size)
        self.seed = seed
        self.start = int(start)

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        generators = [torch.Generator().manual_seed(seed_hash(self.seed, "minibatch", i)) for i in range(len(self.splits))]
        k = 0
        while True:
            keys = []
            for (env_index, positions), generator in zip(self.splits, generators):
                drawn = torch.randint(len(positions), (self.batch_size,), generator=generator).tolist()
                seeds = torch.randint(2**62, (self.batch_size,), generator=generator).tolist()
                keys += [(env_index, positions[d], s) for d, s in zip(drawn, seeds)]
            if k >= self.start:
                yield keys
            k += 1


class LoaderMinibatches:
    """Training batches from one DataLoader with persistent workers over all training environments.

    state() is the number of batches consumed; load_state() restarts the workers there.
    """

    def __init__(
        self,
        examples: FileExamples,
        splits: Sequence[tuple[int, list[int]]],
        batch_size: int,
        seed: int,
        device: torch.device,
        num_workers: int,
    ) -> None:
        self.examples = examples
        self.splits = list(splits)
        self.batch_size = int(batch_size)
        self.seed = seed
        self.device = device
        self.num_workers = num_workers
        self.consumed = 0
        self._iterator: Iterator | None = None

    def _start(self) -> Iterator:
        loader = DataLoader(
            self.examples,
            batch_sampler=InfiniteTrainingBatches(self.splits, self.batch_size, self.seed, self.consumed),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            **({"collate_fn": self.examples.collate(self.batch_size)} if isinstance(self.examples, CachedExamples)
               else {}),
        )
        return iter(loader)

    def next(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One (x, y) batch per training environment, on the device."""
        if self._iterator is None:
            self._iterator = self._start()
        x, y = next(self._iterator)
        self.consumed += 1
        n = self.batch_size
        parts = x if isinstance(x, (tuple, list)) else [x[j * n:(j + 1) * n] for j in range(len(self.splits))]
        return [
            (to_device(parts[j], self.device), y[j * n:(j + 1) * n].to(self.device, non_blocking=True))
            for j in range(len(self.splits))
        ]

    def state(self) -> dict[str, int]:
        """What a checkpoint stores: the number of batches consumed."""
        return {"consumed": self.consumed}

    def load_state(self, state: Mapping[str, int]) -> None:
        """Continue after `state['consumed']` batches (the workers restart there)."""
        self.consumed = int(state["consumed"])
        self._iterator = None


class EvaluationKeys(Sampler):
    """The batches of one split, set before each pass (the loader and its workers stay)."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, int, int | None]] = []
        self.batch_size = 1

    def __iter__(self) -> Iterator[list[tuple[int, int, int | None]]]:
        for start in range(0, len(self.keys), self.batch_size):
            yield self.keys[start:start + self.batch_size]

    def __len__(self) -> int:
        return -(-len(self.keys) // self.batch_size)


class FileDomains(MultiDomainDataset):
    """A dataset whose environments are image files, read by DataLoader workers.

    Subclasses fill `self.environments` with FileEnvironment objects. Under the domainbed
    protocol (DOMAINBED_SEED set) the splits of training environments are evaluated through
    the training augmentation, as DomainBed attaches it to whole training environments: each
    example's augmentation is drawn anew at each checkpoint (`eval_round`), seeded by
    (DOMAINBED_SEED, checkpoint, environment, position), so a resumed run evaluates as an
    uninterrupted one.
    """

    HPARAMS = RESNET_HPARAMS
    EVAL_BATCH_SIZE: ClassVar[int] = 128
    # None: training draws are augmented in every environment; a tuple: only in these environments
    AUGMENTED_ENVIRONMENTS: ClassVar[tuple[int, ...] | None] = None

    def __init__(self, data_dir: str, test_envs: Sequence[int], hparams: Mapping[str, Any]) -> None:
        super().__init__(data_dir, test_envs, hparams)
        self.image_size = int(self.hparams.get("image_size", 224))
        if self.image_size < 8:
            raise DomaingenError(f"hyperparameter 'image_size' must be at least 8 pixels, got {self.image_size}")
        self.num_workers = resolve_workers(self.hparams.get("num_workers", "auto"))
        self._examples: FileExamples | None = None
        self._image_cache: ImageCache | None = None
        self._eval_keys = EvaluationKeys()
        self._eval_loader: DataLoader | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.INPUT_SHAPE[0], self.image_size, self.image_size)

    def training_transform(self) -> Callable[[Image.Image], torch.Tensor]:
        """The augmentation of training examples (DomainBed's for image folders; a dataset may override)."""
        return train_transform(self.image_size)

    def augments(self, env_index: int) -> bool:
        """Whether DomainBed reads environment `env_index` through the training augmentation (also when
        evaluating it, which the domainbed protocol reproduces): every environment but the test ones,
        or exactly AUGMENTED_ENVIRONMENTS where a dataset ties augmentation to the environment."""
        if self.AUGMENTED_ENVIRONMENTS is None:
            return env_index not in self.test_envs
        return env_index in self.AUGMENTED_ENVIRONMENTS

    def image_root(self) -> Path | None:
        """The folder every image file lies under, which names and keys the decoded-image cache; None: this
        dataset has no cache."""
        return None

    def use_image_cache(self, cache_dir: Path) -> bool:
        """Read images from the decoded-image cache in `cache_dir` (see attach_image_cache); False where the
        dataset has no image_root or augments with a transform of its own."""
        if self.image_root() is None or type(self).training_transform is not FileDomains.training_transform:
            return False
        self.attach_image_cache(self.image_root(), cache_dir)
        return True

    def attach_image_cache(self, root: Path, cache_dir: Path) -> None:
        """Read every environment's images from the decoded-image cache of `root` in `cache_dir` (built
        or rebuilt there first when its key differs; see image_cache), through DomainBed's transforms
        on tensors. Only for datasets whose training augmentation is DomainBed's."""
        paths = [p for env in self.environments for p in env.paths]
        decode = functools.partial(decoded_square, size=self.image_size)
        self._image_cache = open_image_cache(root, paths, self.image_size, cache_dir, decode, self.num_workers)
        self._examples = None

    def examples(self) -> FileExamples:
        """All environments' examples with this dataset's transforms (built once)."""
        if self._examples is None:
            augmented = self.AUGMENTED_ENVIRONMENTS  # None: every example drawn for training is augmented
            if self._image_cache is not None:
                self._examples = CachedExamples(self.environments, self._image_cache, self.image_size, augmented)
            else:
                self._examples = FileExamples(
                    self.environments, self.training_transform(), eval_transform(self.image_size), augmented
                )
            for env in self.environments:
                env.transform = eval_transform(self.image_size)
        return self._examples

    def _env_index(self, split: Split) -> int:
        for i, env in enumerate(self.environments):
            if env is split.env:
                return i
        raise ValueError("the split does not belong to this dataset")

    def minibatch_sampler(self, splits, batch_size, seed, device) -> LoaderMinibatches:
        keyed = [(self._env_index(s), s.index.tolist()) for s in splits]
        log.info("training loader: %d worker processes for %d environments", self.num_workers, len(splits))
        return LoaderMinibatches(self.examples(), keyed, batch_size, seed, device, self.num_workers)

    def _eval_augmentation_seed(self, env_index: int, position: int) -> int | None:
        """None (the evaluation transform), or the seed of the training augmentation (domainbed protocol)."""
        if self.DOMAINBED_SEED is None or not self.augments(env_index):
            return None
        return seed_hash(self.DOMAINBED_SEED, "eval", self.eval_round, env_index, position)

    def eval_batches(self, split: Split, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._eval_loader is None:
            self._eval_loader = DataLoader(
                self.examples(),
                batch_sampler=self._eval_keys,
                num_workers=self.num_workers,
                persistent_workers=self.num_workers > 0,
                pin_memory=torch.cuda.is_available(),
            )
        env_index = self._env_index(split)
        self._eval_keys.keys = [(env_index, p, self._eval_augmentation_seed(env_index, p)) for p in split.index.tolist()]
        self._eval_keys.batch_size = min(int(batch_size), self.EVAL_BATCH_SIZE)
        yield from self._eval_loader
