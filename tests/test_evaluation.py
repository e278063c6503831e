"""Evaluation batches: cache-sized on a CPU, large on an accelerator, and accuracies that do not depend on them."""

from __future__ import annotations

import torch

from domaingen.datasets.base import Environment
from domaingen.datasets.splits import Split
from domaingen.run.evaluation import (
    ACCELERATOR_EVAL_BATCH_SIZE,
    CPU_DENSE_EVAL_BATCH_SIZE,
    CPU_EVAL_BATCH_SIZE,
    eval_batch_size,
    evaluate,
    split_accuracy,
)


class LinearModel(torch.nn.Module):
    """A fixed linear classifier with the Algorithm interface that `evaluate` uses; records batch sizes."""

    EVAL_MODES: dict[str, bool] = {}

    def __init__(self, with_convolution: bool = True) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        # unused by predict: it only makes the model count as a convolutional network for eval_batch_size
        self.convolution = torch.nn.Conv2d(1, 1, 1) if with_convolution else None
        self.batch_sizes: list[int] = []

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(len(x))
        return self.linear(x)


def _split(n: int, seed: int) -> Split:
    g = torch.Generator().manual_seed(seed)
    env = Environment("toy", torch.randint(0, 256, (n, 4), dtype=torch.uint8, generator=g),
                      torch.randint(0, 3, (n,), generator=g))
    return Split(env, torch.randperm(n, generator=g))


def test_batch_size_is_cache_sized_on_cpu_and_large_elsewhere():
    assert eval_batch_size(torch.device("cpu")) == CPU_EVAL_BATCH_SIZE == 128
    assert eval_batch_size(torch.device("cuda")) == ACCELERATOR_EVAL_BATCH_SIZE == 2048
    assert eval_batch_size(torch.device("cuda:1")) == 2048


def test_networks_without_convolutions_evaluate_in_larger_cpu_batches():
    from domaingen.networks import MLP, MNIST_CNN

    mlp = torch.nn.Sequential(MLP(1568, 256, 256, 3, 0.0), torch.nn.Linear(256, 2))
    cnn = torch.nn.Sequential(MNIST_CNN((2, 28, 28)), torch.nn.Linear(128, 2))
    assert eval_batch_size(torch.device("cpu"), mlp) == CPU_DENSE_EVAL_BATCH_SIZE == 1024
    assert eval_batch_size(torch.device("cpu"), cnn) == CPU_EVAL_BATCH_SIZE
    assert eval_batch_size(torch.device("cuda"), mlp) == eval_batch_size(torch.device("cuda"), cnn) == 2048
    model = LinearModel(with_convolution=False)
    splits = [(_split(2500, 7), _split(40, 8))]
    dense = evaluate(model, splits, torch.device("cpu"))
    assert model.batch_sizes == [1024, 1024, 452, 40]
    assert dense == evaluate(model, splits, torch.device("cpu"), batch_size=CPU_EVAL_BATCH_SIZE)


def test_cpu_evaluation_uses_cpu_batches_and_equals_a_single_pass():
    torch.manual_seed(0)
    model = LinearModel()
    splits = [(_split(300, 1), _split(75, 2)), (_split(260, 3), _split(0, 4))]
    results = evaluate(model, splits, torch.device("cpu"))
    # 300 = 128 + 128 + 44, 75, 260 = 128 + 128 + 4; the empty split is never predicted
    assert model.batch_sizes == [128, 128, 44, 75, 128, 128, 4]
    with torch.no_grad():
        for i, (split_in, split_out) in enumerate(splits):
            for name, split in (("in", split_in), ("out", split_out)):
                if len(split) == 0:
                    assert results[f"env{i}_{name}_acc"] != results[f"env{i}_{name}_acc"]  # NaN
                    continue
                x, y = split.env.x[split.index].float() / 255, split.env.y[split.index]
                expected = int((model.linear(x).argmax(1) == y).sum()) / len(y)
                assert results[f"env{i}_{name}_acc"] == expected
                assert split_accuracy(model, split, torch.device("cpu")) == results[f"env{i}_{name}_acc"]


def test_accuracies_do_not_depend_on_the_batch_size():
    torch.manual_seed(0)
    model = LinearModel()
    splits = [(_split(1000, 5), _split(250, 6))]
    small = evaluate(model, splits, torch.device("cpu"))
    assert model.batch_sizes[:2] == [128, 128]
    large = evaluate(model, splits, torch.device("cpu"), batch_size=ACCELERATOR_EVAL_BATCH_SIZE)
    assert small == large
    assert model.batch_sizes[-2:] == [1000, 250]


class ImageModel(torch.nn.Module):
    """Flatten + linear, optionally behind a 1x1 convolution; records the memory format of what it sees."""

    EVAL_MODES: dict[str, bool] = {}

    def __init__(self, with_convolution: bool) -> None:
        super().__init__()
        self.convolution = torch.nn.Conv2d(2, 2, 1) if with_convolution else torch.nn.Identity()
        self.linear = torch.nn.Linear(2 * 4 * 4, 3)
        self.channels_last_seen: list[bool] = []

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        self.channels_last_seen.append(x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())
        return self.linear(self.convolution(x).flatten(1))


def test_only_convolutional_networks_get_channels_last_batches_and_predictions_do_not_change():
    g = torch.Generator().manual_seed(9)
    env = Environment("toy", torch.randint(0, 256, (300, 2, 4, 4), dtype=torch.uint8, generator=g),
                      torch.randint(0, 3, (300,), generator=g))
    split = Split(env, torch.arange(300))
    torch.manual_seed(0)
    mlp, cnn = ImageModel(with_convolution=False), ImageModel(with_convolution=True)
    mlp_acc = evaluate(mlp, [(split, split)], torch.device("cpu"))
    evaluate(cnn, [(split, split)], torch.device("cpu"))
    assert mlp.channels_last_seen and not any(mlp.channels_last_seen)
    assert cnn.channels_last_seen and all(cnn.channels_last_seen)
    # the MLP's logits on a channels-last copy of the same batch are bitwise the same
    x = env.x.float() / 255
    with torch.no_grad():
        assert torch.equal(mlp.predict(x), mlp.predict(x.contiguous(memory_format=torch.channels_last)))
        expected = int((mlp.predict(x).argmax(1) == env.y).sum()) / 300
    assert mlp_acc["env0_in_acc"] == mlp_acc["env0_out_acc"] == expected


class TwoModeModel(LinearModel):
    """LinearModel with a test-time mode ('negated': the logits negated) and `predict_modes`, counting its calls."""

    EVAL_MODES = {"negated": False}

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list] = []

    def predict_mode(self, x: torch.Tensor, mode: str, domain=None) -> torch.Tensor:
        return -self.linear(x)

    def predict_modes(self, x: torch.Tensor, modes, domain=None) -> list[torch.Tensor]:
        self.calls.append(list(modes))
        return [self.predict(x) if mode is None else self.predict_mode(x, mode) for mode in modes]


def test_evaluation_reads_each_batch_once_for_every_mode():
    torch.manual_seed(0)
    model = TwoModeModel()
    splits = [(_split(300, 1), _split(75, 2))]
    results = evaluate(model, splits, torch.device("cpu"))
    assert model.calls == [[None, "negated"]] * 4  # 128 + 128 + 44, 75: four batches, both modes each
    with torch.no_grad():
        for name, split in (("in", splits[0][0]), ("out", splits[0][1])):
            x, y = split.batch(slice(None))
            logits = model.linear(x.float())
            assert results[f"env0_{name}_acc"] == int((logits.argmax(1) == y).sum()) / len(y)
            assert results[f"env0_{name}_acc_negated"] == int(((-logits).argmax(1) == y).sum()) / len(y)
    assert list(results) == ["env0_in_acc", "env0_out_acc", "env0_in_acc_negated", "env0_out_acc_negated"]
