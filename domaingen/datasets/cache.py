"""Built datasets kept between the jobs of one worker process (a bounded LRU cache).

A sweep worker (a local or parallel launcher's process, a Slurm or Ray task that
runs a chunk of jobs) builds ColoredMNIST, RotatedMNIST, ... once and reuses the
environments for every later job on the same data. Only datasets whose
environments are tensors in memory (`Environment`) are kept: image datasets
hold file lists and DataLoader workers, which are cheap to list and not safe to share.

The key holds everything that decides the examples: the dataset's registered
name and class, its environment definitions (every upper-case class constant
of plain values: ENVIRONMENTS, COLOR_FLIP, ANGLES, DATA_SEED, ...), the data
directory (absolute) and a fingerprint of the files under it that the dataset
reads (their sizes and modification times). The in/out splits of each
(trial_seed, holdout_fraction) are kept with the entry. A job gets a shallow
copy of the cached dataset with its own test_envs and hparams; the environment
tensors are shared and never written to (batches are new tensors).

The bound is on the bytes of the kept tensors (inputs, labels, split indices):
`--dataset_cache_mb` (MiB), default DEFAULT_CACHE_MB (ColoredMNIST: 111 MB, RotatedMNIST: 56 MB);
0 disables the cache. When an entry would exceed it, the least recently used
entries are evicted first; an entry larger than the bound itself is not kept.

Besides built datasets, the cache keeps their sources: what a dataset reads before
anything depends on a run (MNIST's 70,000 decoded digits). A dataset built for one
run's seed (the domainbed protocol's MNIST environments) is not kept, but within
`with cache.serving_sources():` its constructor's `cached_source(key, build)` calls are
served from the cache, so a worker's later jobs skip reading and decoding the files.
Sources count towards the same bound and are never written to.
"""

from __future__ import annotations

import contextlib
import copy
import contextvars
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Iterator, Mapping, Sequence, TypeVar

import torch

from domaingen.datasets.base import EMBEDDED, Environment, MultiDomainDataset
from domaingen.datasets.splits import Split, built_as_domainbed, split_environments

log = logging.getLogger(__name__)

DEFAULT_CACHE_MB = 1024
CACHE_MB_ENV = "DOMAINGEN_DATASET_CACHE_MB"

T = TypeVar("T")
# The cache that serves `cached_source` calls in this context (`DatasetCache.serving_sources`).
_SERVING: contextvars.ContextVar["DatasetCache | None"] = contextvars.ContextVar("domaingen_sources", default=None)


def serving_sources() -> bool:
    """Whether a DatasetCache serves sources in this context (`cached_source` keeps what it builds)."""
    return _SERVING.get() is not None


def cached_source(key: Hashable, build: Callable[[], T], nbytes: Callable[[T], int] | None = None) -> T:
    """`build()`, or what it returned for the same `key` earlier in this process when a DatasetCache
    serves sources here (`DatasetCache.serving_sources`); `nbytes(value)` is its size for the bound.

    The key must hold everything that decides the value (a directory, its files' fingerprint).
    """
    cache = _SERVING.get()
    return build() if cache is None else cache.source(key, build, nbytes)


def definition(cls: type[MultiDomainDataset]) -> tuple[tuple[str, Any], ...]:
    """The class constants that define a dataset's environments, as a hashable, sorted tuple."""
    items = []
    for name in dir(cls):
        if not name.isupper() or name == "HPARAMS":
            continue
        value = getattr(cls, name)
        if isinstance(value, (int, float, str, bool, tuple)) or value is None:
            items.append((name, value))
    return tuple(sorted(items, key=lambda item: item[0]))


def source_fingerprint(data_dir: str) -> tuple[tuple[str, int, int], ...] | str:
    """(relative path, size, mtime in ns) of the files under `data_dir`'s MNIST folder, or 'embedded'.

    The MNIST datasets read `<data_dir>/MNIST/raw`; a replaced or re-downloaded file
    changes the fingerprint, so a cached dataset is never served from stale files.
    """
    if data_dir == EMBEDDED:
        return EMBEDDED
    root = Path(data_dir).expanduser() / "MNIST"
    found = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            try:
                stat = path.stat()
            except OSError:
                continue
            found.append((str(path.relative_to(root)), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(found))


def cache_key(name: str, cls: type[MultiDomainDataset], data_dir: str) -> Hashable:
    """What decides a dataset's examples: name, class, environment definitions, data directory and files."""
    directory = data_dir if data_dir == EMBEDDED else str(Path(data_dir).expanduser().resolve())
    return (name, f"{cls.__module__}.{cls.__qualname__}", definition(cls), directory, source_fingerprint(data_dir))


def tensor_bytes(environments: Sequence[Environment]) -> int:
    """Bytes of the environments' tensors (inputs, labels, source indices)."""
    total = 0
    for env in environments:
        for tensor in (env.x, env.y, env.source_index):
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


def _split_bytes(splits: Sequence[tuple[Split, Split]]) -> int:
    return sum(s.index.numel() * s.index.element_size() for pair in splits for s in pair)


@dataclass
class _Entry:
    dataset: MultiDomainDataset
    splits: dict[tuple[int, float], list[tuple[Split, Split]]] = field(default_factory=dict)
    nbytes: int = 0


@dataclass
class CacheStats:
    """Hits, misses and evictions so far, for logs and tests."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    source_hits: int = 0
    source_misses: int = 0


class DatasetCache:
    """An LRU cache of built in-memory datasets and their splits, bounded by `max_mb` megabytes."""

    def __init__(self, max_mb: float = DEFAULT_CACHE_MB) -> None:
        if max_mb < 0:
            raise ValueError(f"max_mb must be at least 0, got {max_mb}")
        self.max_bytes = int(max_mb * 2**20)
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._sources: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.stats = CacheStats()

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return (sum(entry.nbytes for entry in self._entries.values())
                + sum(size for _, size in self._sources.values()))

    @contextlib.contextmanager
    def serving_sources(self) -> Iterator["DatasetCache"]:
        """Within this block, `cached_source` calls (dataset constructors) are served from this cache."""
        token = _SERVING.set(self)
        try:
            yield self
        finally:
            _SERVING.reset(token)

    def source(self, key: Hashable, build: Callable[[], T], nbytes: Callable[[T], int] | None = None) -> T:
        """`build()` once per key (see `cached_source`), kept within the bound (LRU, with the datasets)."""
        if self.max_bytes == 0:
            return build()
        key = ("source", key)
        if key in self._sources:
            self.stats.source_hits += 1
            self._sources.move_to_end(key)
            return self._sources[key][0]
        self.stats.source_misses += 1
        value = build()
        size = nbytes(value) if nbytes is not None else 0
        if size > self.max_bytes:
            log.info("source %s (%.0f MB) exceeds the dataset cache; not kept", key[1], size / 2**20)
            return value
        self._sources[key] = (value, size)
        self._evict(keep=key)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def dataset(
        self,
        name: str,
        cls: type[MultiDomainDataset],
        data_dir: str,
        test_envs: Sequence[int],
        hparams: Mapping[str, Any],
        build: Callable[[], MultiDomainDataset] | None = None,
    ) -> MultiDomainDataset:
        """The dataset `cls(data_dir, test_envs, hparams)`, built once per key and shared.

        `build` replaces the constructor call (tests count the builds through it).
        """
        build = build or (lambda: cls(data_dir, test_envs, hparams))
        if self.max_bytes == 0:
            return build()
        key = cache_key(name, cls, data_dir)
        entry = self._entries.get(key)
        if entry is None:
            self.stats.misses += 1
            dataset = build()
            if not dataset.environments or not all(isinstance(e, Environment) for e in dataset.environments):
                return dataset  # files and loaders, not tensors: not kept
            entry = _Entry(dataset, nbytes=tensor_bytes(dataset.environments))
            self._store(key, entry)
        else:
            self.stats.hits += 1
            self._entries.move_to_end(key)
        shared = copy.copy(entry.dataset)
        shared.test_envs = list(test_envs)
        shared.hparams = dict(hparams)
        return shared

    def splits(self, dataset: MultiDomainDataset, holdout_fraction: float, trial_seed: int,
               in_domain_test: float | None = None, test_envs: Sequence[int] = ()) -> list[tuple[Split, Split]]:
        """split_environments(dataset, holdout_fraction, trial_seed, in_domain_test, test_envs),
        kept with the dataset's entry (if cached)."""
        entry = self._entry_of(dataset)
        if entry is None:
            return split_environments(dataset, holdout_fraction, trial_seed, in_domain_test, test_envs)
        # the in splits depend on which environments are held out only with an in-domain test split, or
        # under DomainBed's split, which reorders a held-out environment's in split
        domainbed = built_as_domainbed(dataset)
        held_out = tuple(sorted(test_envs)) if in_domain_test or domainbed else ()
        key = (int(trial_seed), float(holdout_fraction), float(in_domain_test or 0.0), held_out, domainbed)
        if key not in entry.splits:
            entry.splits[key] = split_environments(dataset, holdout_fraction, trial_seed, in_domain_test, test_envs)
            entry.nbytes += _split_bytes(entry.splits[key])
            self._evict(keep=self._key_of(entry))
        return entry.splits[key]

    def _key_of(self, entry: _Entry) -> Hashable | None:
        return next((k for k, e in self._entries.items() if e is entry), None)

    def _entry_of(self, dataset: MultiDomainDataset) -> _Entry | None:
        for entry in self._entries.values():
            if entry.dataset.environments is dataset.environments:
                return entry
        return None

    def _store(self, key: Hashable, entry: _Entry) -> None:
        if entry.nbytes > self.max_bytes:
            log.info("dataset %s (%.0f MB) exceeds the dataset cache (%.0f MB); not kept",
                     key[0], entry.nbytes / 2**20, self.max_bytes / 2**20)
            return
        self._entries[key] = entry
        self._evict(keep=key)

    def _evict(self, keep: Hashable | None) -> None:
        """Drop least recently used entries, datasets before sources (never `keep`) until the bound holds;
        `keep` itself if need be."""
        while self.nbytes > self.max_bytes and (self._entries or self._sources):
            victim = next((k for k in [*self._entries, *self._sources] if k != keep), keep)
            (self._entries if victim in self._entries else self._sources).pop(victim, None)
            self.stats.evictions += 1
            log.info("dataset cache: evicted %s", victim[0] if victim[0] != "source" else victim[1])
            if victim == keep:
                break

    def clear(self) -> None:
        self._entries.clear()
        self._sources.clear()


def cache_mb_default() -> float:
    """$DOMAINGEN_DATASET_CACHE_MB, else DEFAULT_CACHE_MB."""
    value = os.environ.get(CACHE_MB_ENV, "").strip()
    return float(value) if value else float(DEFAULT_CACHE_MB)
