"""The decoded-image cache: its key, rebuilds, pixels equal to the PIL path's, bad input, the run setting."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from domaingen.datasets import image_cache as ic
from domaingen.datasets.image_cache import IMAGE_CACHE_DIR_ENV, image_cache_dir, open_image_cache, tree_fingerprint
from domaingen.datasets.images import PACS
from domaingen.datasets.loading import CachedExamples, decoded_square
from domaingen.devices import to_device
from domaingen.errors import DomaingenError
from domaingen.run.training import TrainConfig, train
from imagetree import make_folder_tree

DOMAINS = list(PACS.ENVIRONMENTS)
CLASSES = ["dog", "horse"]
SMALL = {"backbone": "resnet18", "pretrained": False, "image_size": 24, "batch_size": 2, "num_workers": 0}


@pytest.fixture
def data_dir(tmp_path):
    """A PACS tree of 40x40 JPEGs, with a non-square JPEG, a PNG and a greyscale PNG among them."""
    make_folder_tree(tmp_path / "PACS", DOMAINS, CLASSES, per_class=2, size=40)
    rng = np.random.default_rng(5)
    Image.fromarray(rng.integers(0, 256, (30, 50, 3), dtype=np.uint8)).save(tmp_path / "PACS/photo/dog/wide.jpg")
    Image.fromarray(rng.integers(0, 256, (45, 20, 3), dtype=np.uint8)).save(tmp_path / "PACS/sketch/dog/tall.png")
    Image.fromarray(rng.integers(0, 256, (33, 33), dtype=np.uint8), "L").save(tmp_path / "PACS/cartoon/horse/grey.png")
    return tmp_path


def paths_of(dataset) -> list[str]:
    return [p for env in dataset.environments for p in env.paths]


def pil_resized(path: str, size: int) -> np.ndarray:
    """What the evaluation transform's Resize((size, size)) gives, by PIL directly: (size, size, 3) uint8."""
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB").resize((size, size), Image.BILINEAR))


def open_cache(dataset, cache_dir, size=24, decode=None):
    decode = decode or (lambda p: decoded_square(p, size))
    return open_image_cache(dataset.image_root(), paths_of(dataset), size, cache_dir, decode)


def test_cached_pixels_equal_pils_resize_of_every_file(data_dir, tmp_path):
    dataset = PACS(str(data_dir), [3], SMALL)
    cache = open_cache(dataset, tmp_path / "cache")
    assert cache.count == len(paths_of(dataset)) == 4 * 2 * 2 + 3
    for i, path in enumerate(paths_of(dataset)):
        image = cache.image(i)
        assert image.shape == (3, 24, 24) and image.dtype == torch.uint8
        assert np.array_equal(image.permute(1, 2, 0).numpy(), pil_resized(path, 24))


def test_cached_evaluation_equals_the_pil_path_value_for_value(data_dir, tmp_path):
    plain = PACS(str(data_dir), [3], SMALL)
    cached = PACS(str(data_dir), [3], SMALL)
    assert cached.use_image_cache(tmp_path / "cache")
    examples, reference = cached.examples(), plain.examples()
    assert isinstance(examples, CachedExamples) and not isinstance(reference, CachedExamples)
    for env_index, env in enumerate(plain.environments):
        for position in range(len(env)):
            x, y = examples[(env_index, position, None)]
            x_ref, y_ref = reference[(env_index, position, None)]
            assert torch.equal(x, x_ref) and y == y_ref and x.is_contiguous()


def test_cached_training_examples_depend_only_on_their_seed(data_dir, tmp_path):
    dataset = PACS(str(data_dir), [3], SMALL)
    dataset.use_image_cache(tmp_path / "cache")
    examples = dataset.examples()
    a, b, c = examples[(1, 2, 7)][0], examples[(1, 2, 7)][0], examples[(1, 2, 8)][0]
    assert torch.equal(a, b) and not torch.equal(a, c) and a.shape == (3, 24, 24)


def test_the_fingerprint_hashes_relative_paths_sizes_and_mtimes_in_order(data_dir):
    root = data_dir / "PACS"
    paths = sorted(str(p) for p in root.rglob("*.jpg"))[:3]
    lines = "".join(f"{os.path.relpath(p, root)}\t{os.stat(p).st_size}\t{os.stat(p).st_mtime_ns}\n" for p in paths)
    assert tree_fingerprint(root, paths) == hashlib.sha256(lines.encode()).hexdigest()
    # the same files seen from a copy of the tree elsewhere: the same fingerprint (paths are relative)
    copy = shutil.copytree(root, data_dir / "copy" / "PACS", copy_function=shutil.copy2)
    assert tree_fingerprint(copy, [p.replace(str(root), str(copy)) for p in paths]) == tree_fingerprint(root, paths)
    assert tree_fingerprint(root, paths[::-1]) != tree_fingerprint(root, paths)
    stat = os.stat(paths[0])
    os.utime(paths[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert tree_fingerprint(root, paths) != hashlib.sha256(lines.encode()).hexdigest()


def test_an_unchanged_tree_reuses_its_cache_without_decoding(data_dir, tmp_path, caplog):
    dataset = PACS(str(data_dir), [3], SMALL)
    open_cache(dataset, tmp_path / "cache")
    calls = []
    with caplog.at_level(logging.INFO, logger="domaingen"):
        cache = open_cache(dataset, tmp_path / "cache", decode=lambda p: calls.append(p))
    assert calls == [] and not [r for r in caplog.records if "image cache" in r.getMessage()]
    assert np.array_equal(cache.image(0).permute(1, 2, 0).numpy(), pil_resized(paths_of(dataset)[0], 24))


def only_data_file(cache_dir: Path) -> Path:
    (data,) = cache_dir.glob("*.npy")
    return data


def test_a_cache_of_another_tree_is_rebuilt_with_one_line_saying_why(data_dir, tmp_path, caplog):
    dataset = PACS(str(data_dir), [3], SMALL)
    open_cache(dataset, tmp_path / "cache")
    before = only_data_file(tmp_path / "cache")
    changed = paths_of(dataset)[5]
    Image.fromarray(np.full((40, 40, 3), 200, dtype=np.uint8)).save(changed)  # new pixels, size and mtime
    with caplog.at_level(logging.INFO, logger="domaingen"):
        cache = open_cache(dataset, tmp_path / "cache")
    lines = [r.getMessage() for r in caplog.records if "image cache" in r.getMessage()]
    assert len(lines) == 1 and "rebuilding" in lines[0] and "another tree (19 files then, 19 now" in lines[0]
    assert np.array_equal(cache.image(5).permute(1, 2, 0).numpy(), pil_resized(changed, 24))
    assert not before.exists() and only_data_file(tmp_path / "cache") != before  # the stale pixels are gone


def test_a_cache_at_another_resolution_is_rebuilt_with_one_line_saying_why(data_dir, tmp_path, caplog):
    dataset = PACS(str(data_dir), [3], SMALL)
    open_cache(dataset, tmp_path / "cache", size=16)
    with caplog.at_level(logging.INFO, logger="domaingen"):
        cache = open_cache(dataset, tmp_path / "cache", size=24)
    lines = [r.getMessage() for r in caplog.records if "image cache" in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith("it holds 16x16 images, not 24x24")
    assert cache.pixels().shape == (19, 24, 24, 3)
    meta = json.loads(next((tmp_path / "cache").glob("*.json")).read_text())
    assert meta["size"] == 24 and meta["count"] == 19


def test_a_truncated_data_file_is_rebuilt(data_dir, tmp_path, caplog):
    dataset = PACS(str(data_dir), [3], SMALL)
    open_cache(dataset, tmp_path / "cache")
    data = only_data_file(tmp_path / "cache")
    data.write_bytes(data.read_bytes()[:1000])
    with caplog.at_level(logging.WARNING, logger="domaingen"):
        cache = open_cache(dataset, tmp_path / "cache")
    assert "missing or truncated" in caplog.text
    assert np.array_equal(cache.image(18).permute(1, 2, 0).numpy(), pil_resized(paths_of(dataset)[18], 24))


def test_the_cache_folder_is_the_environment_variable_else_beside_the_data(monkeypatch, tmp_path):
    monkeypatch.delenv(IMAGE_CACHE_DIR_ENV, raising=False)
    assert image_cache_dir(str(tmp_path)) == tmp_path / "image_cache"
    monkeypatch.setenv(IMAGE_CACHE_DIR_ENV, str(tmp_path / "elsewhere"))
    assert image_cache_dir(str(tmp_path)) == tmp_path / "elsewhere"


def test_an_unwritable_cache_folder_says_what_to_set(data_dir, tmp_path):
    (tmp_path / "a_file").write_text("")
    dataset = PACS(str(data_dir), [3], SMALL)
    with pytest.raises(DomaingenError, match=rf"cannot write the image cache in {tmp_path}/a_file/cache .*; set "
                                             rf"{IMAGE_CACHE_DIR_ENV} to a writable folder, or leave image_cache off"):
        open_cache(dataset, tmp_path / "a_file" / "cache")


def test_a_cache_larger_than_the_free_space_is_refused(data_dir, tmp_path, monkeypatch):
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(ic.shutil, "disk_usage", lambda path: Usage(10**6, 10**6 - 1000, 1000))
    dataset = PACS(str(data_dir), [3], SMALL)
    needed = 19 * 3 * 24 * 24 / 1e9
    with pytest.raises(DomaingenError, match=rf"needs {needed:.1f} GB and .* has 0.0 GB free; set {IMAGE_CACHE_DIR_ENV} "
                                             "to a folder with room, or leave image_cache off"):
        open_cache(dataset, tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.npy"))


def test_a_file_that_cannot_be_decoded_is_replaced_by_the_next_example(data_dir, tmp_path, caplog):
    dataset = PACS(str(data_dir), [3], SMALL)
    broken = dataset.environments[0].paths[1]

    def decode(path):
        if path == broken:
            raise OSError("truncated")
        return decoded_square(path, 24)

    with caplog.at_level(logging.WARNING, logger="domaingen"):
        dataset._image_cache = open_cache(dataset, tmp_path / "cache", decode=decode)
    assert "cannot decode" in caplog.text and dataset._image_cache.unreadable == {1}
    x, y = dataset.examples()[(0, 1, None)]
    x_next, y_next = dataset.examples()[(0, 2, None)]
    assert torch.equal(x, x_next) and y == y_next


def run_config(out, data_dir, **kw) -> TrainConfig:
    return TrainConfig(dataset="PACS", algorithm="ERM", output_dir=str(out), test_envs=[3], data_dir=str(data_dir),
                       hparams=dict(SMALL), steps=2, checkpoint_freq=1, eval_splits="all", **kw)


def test_the_run_setting_reads_the_cache_and_records_it(data_dir, tmp_path, monkeypatch):
    monkeypatch.delenv(IMAGE_CACHE_DIR_ENV, raising=False)
    cached = train(run_config(tmp_path / "cached", data_dir, image_cache=True))
    plain = train(run_config(tmp_path / "plain", data_dir, image_cache=False))
    assert cached.state == plain.state == "done"
    assert json.loads((tmp_path / "cached" / "args.json").read_text())["image_cache"] is True
    assert json.loads((tmp_path / "plain" / "args.json").read_text())["image_cache"] is None  # false: the default
    assert len(list((data_dir / "image_cache").glob("PACS-*.npy"))) == 1
    # at step 0 (the same initial weights) the held-out environment's accuracy reads evaluation pixels only
    assert [cached.records[0][f"env3_{s}_acc"] for s in ("in", "out")] == \
        [plain.records[0][f"env3_{s}_acc"] for s in ("in", "out")]


def test_the_run_setting_on_a_dataset_without_files_warns_and_trains(tmp_path, caplog):
    config = TrainConfig(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(tmp_path / "r"), test_envs=[2],
                         data_dir="embedded", hparams={"featurizer": "MLP", "mlp_width": 8}, steps=1,
                         image_cache=True)
    with caplog.at_level(logging.WARNING, logger="domaingen"):
        assert train(config).state == "done"
    assert "image_cache: ColoredMNIST has no image files to cache" in caplog.text


def test_a_pickled_cache_carries_no_pixels_and_maps_the_file_again(data_dir, tmp_path):
    import pickle

    dataset = PACS(str(data_dir), [3], SMALL)
    cache = open_cache(dataset, tmp_path / "cache")
    data = pickle.dumps(cache)  # what a spawned DataLoader worker receives
    assert len(data) < 2000 < cache.count * 3 * 24 * 24
    assert torch.equal(pickle.loads(data).image(7), cache.image(7))


@pytest.mark.parametrize("workers", [0, 2])
def test_cached_training_batches_are_channels_last_and_equal_the_examples_one_by_one(data_dir, tmp_path, workers):
    """The training loader's batches are written in place as channels-last batches, one per environment, equal
    to the examples computed one at a time, and move to the CPU device without a copy."""
    from domaingen.datasets.loading import InfiniteTrainingBatches
    from domaingen.datasets.splits import split_environments

    dataset = PACS(str(data_dir), [3], {**SMALL, "num_workers": workers})
    dataset.use_image_cache(tmp_path / "cache")
    splits = [s_in for s_in, _ in split_environments(dataset, 0.2, 0)[:3]]
    sampler = dataset.minibatch_sampler(splits, 3, 0, torch.device("cpu"))
    keys = next(iter(InfiniteTrainingBatches(sampler.splits, 3, 0)))
    parts = sampler.next()
    examples = dataset.examples()
    for j, (x, y) in enumerate(parts):
        assert x.shape == (3, 3, 24, 24) and x.is_contiguous(memory_format=torch.channels_last)
        expected = [examples[key] for key in keys[3 * j:3 * j + 3]]
        assert torch.allclose(x, torch.stack([e[0] for e in expected]), atol=1e-5)  # fused normalisation rounds
        assert y.tolist() == [e[1] for e in expected]
    moved = to_device(parts[0][0], torch.device("cpu"))
    assert moved.data_ptr() == parts[0][0].data_ptr()


def test_channels_last_batches_copies_examples_that_are_not_slots_of_one_batch():
    from domaingen.datasets.loading import channels_last_batches

    images = [torch.rand(3, 5, 4) for _ in range(4)]
    batches, labels = channels_last_batches([(x, k) for k, x in enumerate(images)], batch_size=2)
    assert len(batches) == 2 and labels.tolist() == [0, 1, 2, 3]
    for j, batch in enumerate(batches):
        assert batch.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(batch, torch.stack(images[2 * j:2 * j + 2]))
    whole = torch.rand(2, 5, 4, 3).permute(0, 3, 1, 2)
    (batch,), _ = channels_last_batches([(whole[0], 0), (whole[1], 1)], batch_size=2)
    assert batch.data_ptr() == whole.data_ptr() and torch.equal(batch, whole)
    (batch,), _ = channels_last_batches([(whole[1], 1), (whole[0], 0)], batch_size=2)  # out of order: copied
    assert batch.data_ptr() != whole.data_ptr() and torch.equal(batch, whole.flip(0))


def test_cached_training_batches_reuse_memory_only_once_nothing_holds_it(data_dir, tmp_path):
    from domaingen.datasets.splits import split_environments

    dataset = PACS(str(data_dir), [3], SMALL)
    dataset.use_image_cache(tmp_path / "cache")
    splits = [s_in for s_in, _ in split_environments(dataset, 0.2, 0)[:3]]
    sampler = dataset.minibatch_sampler(splits, 3, 0, torch.device("cpu"))
    first = sampler.next()
    kept = [x.clone() for x, _ in first]
    second = sampler.next()
    assert all(torch.equal(x, k) for (x, _), k in zip(first, kept))  # held: not written over
    held = {x.data_ptr() for x, _ in first + second}
    assert len(held) == 6
    first_pointers = {x.data_ptr() for x, _ in first}
    del first, kept
    third = sampler.next()
    assert {x.data_ptr() for x, _ in third} == first_pointers  # released: written again
    assert all(not torch.equal(a, b) for (a, _), (b, _) in zip(second, third))
