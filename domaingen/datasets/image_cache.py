"""The decoded-image cache: a dataset's images as uint8 tensors (3, S, S), one array on disk, memory-mapped.

Built once (a tqdm progress bar; DataLoader workers decode) from a list of image files under a
root folder, at the training resolution S; read by memory-mapping, so every worker shares the
pages the kernel caches. Files, in the cache folder (`image_cache_dir`):

- `<name>.json`: what the cache holds: resolution, image count, the tree's fingerprint, the
  data file's name and the positions of files that could not be decoded;
- `<name>-<S>px-<fingerprint>.npy`: the pixels, an (N, S, S, 3) uint8 array in numpy's .npy format:
  channels last, the layout torch's uint8 resize reads fastest (a crop costs about 40% less than
  from (N, 3, S, S)); `ImageCache.image(i)` is image i's (3, S, S) view of it;
- `<name>.lock`: held while one process checks or builds, so parallel jobs build once.

`<name>` is the root folder's name and a hash of its absolute path. The key is the resolution
and the fingerprint of the tree: the files' relative paths, sizes and modification times, in
the dataset's order. A cache whose key differs (another tree, another resolution, a missing or
truncated data file) is rebuilt, with one logged line saying why, and the stale data file is
removed.

The folder is `$DOMAINGEN_IMAGE_CACHE_DIR` when set, else `<data_dir>/image_cache/`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from domaingen.errors import DomaingenError

log = logging.getLogger(__name__)

IMAGE_CACHE_DIR_ENV = "DOMAINGEN_IMAGE_CACHE_DIR"
CACHE_FORMAT = 1
BUILD_BATCH = 32


def image_cache_dir(data_dir: str) -> Path:
    """Where image caches live: $DOMAINGEN_IMAGE_CACHE_DIR, else <data_dir>/image_cache."""
    configured = os.environ.get(IMAGE_CACHE_DIR_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path(data_dir).expanduser() / "image_cache"


def tree_fingerprint(root: Path, paths: Sequence[str]) -> str:
    """SHA-256 of each file's path relative to `root`, size and mtime (ns), in the given order."""
    digest = hashlib.sha256()
    for path in paths:
        stat = os.stat(path)
        digest.update(f"{os.path.relpath(path, root)}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class CacheKey:
    """What decides a cache's pixels: the resolution, the image count and the tree's fingerprint."""

    size: int
    count: int
    fingerprint: str

    def data_name(self, name: str) -> str:
        return f"{name}-{self.size}px-{self.fingerprint[:16]}.npy"


@dataclass
class ImageCache:
    """An opened cache: image i is `image(i)`, a (3, S, S) uint8 tensor (channels last in memory); `unreadable` holds the
    positions whose file could not be decoded (their pixels are zeros)."""

    path: Path
    count: int
    size: int
    unreadable: frozenset[int] = frozenset()
    _pixels: np.ndarray | None = field(default=None, repr=False)

    def pixels(self) -> np.ndarray:
        """The memory-mapped (N, S, S, 3) array (mapped again in each process that unpickles the cache)."""
        if self._pixels is None:
            self._pixels = np.load(self.path, mmap_mode="r")
        return self._pixels

    def image(self, index: int) -> torch.Tensor:
        """Image `index` as a new (3, S, S) uint8 tensor, channels last in memory."""
        return torch.from_numpy(np.array(self.pixels()[index])).permute(2, 0, 1)

    def __getstate__(self) -> dict:
        # a pickled np.memmap would carry every pixel; a worker maps the file itself
        return {**self.__dict__, "_pixels": None}


def cache_name(root: Path) -> str:
    """The cache's file stem for the image tree at `root`."""
    where = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:10]
    return f"{Path(root).name}-{where}"


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _prepare_dir(cache_dir: Path) -> None:
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(cache_dir, os.W_OK):
            raise PermissionError(13, "not writable")
    except OSError as exc:
        raise DomaingenError(f"cannot write the image cache in {cache_dir} ({exc.strerror or exc}); set "
                             f"{IMAGE_CACHE_DIR_ENV} to a writable folder, or leave image_cache off") from None


def stale_reason(meta: dict | None, key: CacheKey, data_path: Path | None) -> str | None:
    """Why the cache described by `meta` cannot serve `key` (None: it can)."""
    if meta is None:
        return "none built yet"
    if meta.get("format") != CACHE_FORMAT:
        return f"it has format {meta.get('format')!r}, not {CACHE_FORMAT}"
    if meta.get("size") != key.size:
        return f"it holds {meta.get('size')}x{meta.get('size')} images, not {key.size}x{key.size}"
    if meta.get("fingerprint") != key.fingerprint:
        return (f"it was built from another tree ({meta.get('count')} files then, {key.count} now; paths, sizes "
                "or modification times differ)")
    expected = key.count * 3 * key.size * key.size
    if data_path is None or not data_path.is_file() or data_path.stat().st_size < expected:
        return f"its data file {data_path} is missing or truncated"
    return None


def _read_meta(meta_path: Path) -> dict | None:
    try:
        return json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return None


class _Decoded(Dataset):
    """(position, pixels or None) of each file, decoded by `decode` (in DataLoader workers)."""

    def __init__(self, paths: Sequence[str], decode: Callable[[str], np.ndarray]) -> None:
        self.paths = list(paths)
        self.decode = decode

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, np.ndarray | None]:
        try:
            return index, self.decode(self.paths[index])
        except OSError as exc:
            log.warning("image cache: cannot decode %s (%s); an example of its environment is read instead",
                        self.paths[index], exc)
            return index, None


def _as_list(items: list) -> list:
    return items


def _build(data_path: Path, paths: Sequence[str], key: CacheKey, decode: Callable[[str], np.ndarray],
           workers: int, label: str) -> list[int]:
    """Write the pixels of `paths` to `data_path` (through a temporary file); the unreadable positions."""
    from tqdm import tqdm

    tmp = data_path.with_name(f"{data_path.name}.tmp{os.getpid()}")
    pixels = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(key.count, key.size, key.size, 3))
    unreadable = []
    loader = DataLoader(_Decoded(paths, decode), batch_size=BUILD_BATCH, num_workers=workers,
                        collate_fn=_as_list)
    try:
        with tqdm(total=key.count, desc=f"image cache {label} {key.size}px", unit="img") as bar:
            for items in loader:
                for index, image in items:
                    if image is None:
                        unreadable.append(index)
                    else:
                        pixels[index] = image
                bar.update(len(items))
        pixels.flush()
        del pixels
        os.replace(tmp, data_path)
    finally:
        tmp.unlink(missing_ok=True)
    return sorted(unreadable)


def open_image_cache(root: Path, paths: Sequence[str], size: int, cache_dir: Path,
                     decode: Callable[[str], np.ndarray], workers: int = 0) -> ImageCache:
    """The cache of the images `paths` (under `root`) at size x size, built or rebuilt when its key differs.

    `decode(path)` gives a file's (size, size, 3) uint8 pixels; it runs in `workers` processes.
    """
    _prepare_dir(cache_dir)
    name = cache_name(root)
    key = CacheKey(int(size), len(paths), tree_fingerprint(root, paths))
    meta_path = cache_dir / f"{name}.json"
    with _locked(cache_dir / f"{name}.lock"):
        meta = _read_meta(meta_path)
        old_data = cache_dir / meta["data"] if meta and isinstance(meta.get("data"), str) else None
        reason = stale_reason(meta, key, old_data)
        if reason is not None:
            if meta is None:
                log.info("building the image cache of %s (%d images at %dpx) in %s", root, key.count, key.size,
                         cache_dir)
            else:
                log.warning("rebuilding the image cache of %s in %s: %s", root, cache_dir, reason)
            needed = key.count * 3 * key.size * key.size
            free = shutil.disk_usage(cache_dir).free
            if needed > free:
                raise DomaingenError(
                    f"the image cache of {root} needs {needed / 1e9:.1f} GB and {cache_dir} has {free / 1e9:.1f} GB "
                    f"free; set {IMAGE_CACHE_DIR_ENV} to a folder with room, or leave image_cache off")
            data_path = cache_dir / key.data_name(name)
            unreadable = _build(data_path, paths, key, decode, workers, Path(root).name)
            meta = {"format": CACHE_FORMAT, "root": str(Path(root).resolve()), "size": key.size,
                    "count": key.count, "fingerprint": key.fingerprint, "data": data_path.name,
                    "unreadable": unreadable}
            tmp_meta = meta_path.with_name(f"{meta_path.name}.tmp{os.getpid()}")
            tmp_meta.write_text(json.dumps(meta, indent=1) + "\n")
            os.replace(tmp_meta, meta_path)
            if old_data is not None and old_data != data_path:
                old_data.unlink(missing_ok=True)
        cache = ImageCache(cache_dir / meta["data"], key.count, key.size, frozenset(meta.get("unreadable", ())))
        cache.pixels()  # mapped while the lock is held: a later rebuild replaces the file, not these pages
    return cache
