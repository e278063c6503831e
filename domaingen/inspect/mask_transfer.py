"""Csordás et al.'s transfer experiment on permuted MNIST (ICLR 2021): do later tasks reuse earlier tasks' weights?

A feedforward network (784 -> widths -> 10, ReLU) learns permutations 0, 1, ..., T-1 of MNIST one
after another, each task p with its own Csordás weight mask (domaingen.masks' hard Gumbel-sigmoid
with the straight-through gradient). Before task p, the weights that any earlier task's mask keeps
(the union of masks 0..p-1, logit > 0: the used weights) are frozen, their gradients zeroed so they
keep their values; every other weight is drawn afresh from the authors' initialisation (Xavier-normal,
`default_init`). Task p's mask logits start at `mask_used_init` on used weights and `mask_new_init` on
the others. Adam trains the free weights and task p's logits together on the cross-entropy plus
alpha times the sum of the logits over the batch size (`mask_loss`); each step cuts the batch into `mask_samples` groups, each
computed with its own mask sample, so the loss is the mean over the samples.

After task p: per layer, the share of task p's kept weights that earlier tasks already use,
|M_p & (M_0 | ... | M_{p-1})| / |M_p| (and over all layers), the kept and used fractions, and the
test accuracy of every task q <= p with its own mask. Frozen weights make the earlier tasks'
accuracies equal, to the last bit, to those measured right after they were trained.

Biases are masked by default, as in the authors' permuted-MNIST task, under the same freezing rule
as the weights; without `mask_biases` (domaingen's other weight masks leave biases unmasked) every
task uses them, so task 0 trains them and they stay frozen afterwards. The sharing statistics count
weights only. Gradients are clipped to a global norm of `grad_clip` (the authors' trainer's 1.0).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from domaingen.errors import DomaingenError
from domaingen.masks import DEFAULT_INIT_LOGIT, sample_hard_masks

log = logging.getLogger(__name__)

INPUTS = 784
CLASSES = 10
EVAL_CHUNK = 2000  # examples per forward pass when measuring accuracy
SEED_STRIDE = 1000  # task p of seed s draws from seed s * SEED_STRIDE + p


@dataclass(frozen=True)
class TransferSettings:
    """The experiment's settings; the defaults are the authors' (their code's defaults and its
    transfer_sharing sweep): masked biases (their permuted-MNIST task refuses unmasked ones) and the
    global gradient-norm clip at 1.0 of their trainer; 0 turns the clip off."""

    tasks: int = 11
    steps: int = 30000
    widths: tuple[int, ...] = (800, 800, 64)
    lr: float = 1e-2
    alpha: float = 0.00128
    mask_used_init: float = DEFAULT_INIT_LOGIT
    mask_new_init: float = DEFAULT_INIT_LOGIT
    mask_samples: int = 8
    batch_size: int = 128
    mask_biases: bool = True
    grad_clip: float = 1.0
    seed: int = 0

    def as_dict(self) -> dict[str, object]:
        """The settings as JSON values (widths as a list)."""
        values = asdict(self)
        values["widths"] = list(self.widths)
        return values


def check_settings(settings: TransferSettings) -> None:
    """Refuse, in one line, settings the experiment cannot run with."""
    s = settings
    if s.tasks < 2:
        raise DomaingenError(f"--tasks must be at least 2 (task p's sharing is measured against tasks 0..p-1), "
                             f"got {s.tasks}")
    if s.steps < 1:
        raise DomaingenError(f"--steps must be positive, got {s.steps}")
    if not s.widths or any(w < 1 for w in s.widths):
        raise DomaingenError(f"--widths takes positive hidden-layer widths, got {','.join(map(str, s.widths))}")
    if not s.alpha >= 0:
        raise DomaingenError(f"--alpha must be non-negative, got {s.alpha}")
    if not s.lr > 0:
        raise DomaingenError(f"--lr must be positive, got {s.lr}")
    if s.mask_samples < 1:
        raise DomaingenError(f"--mask_samples must be positive, got {s.mask_samples}")
    if not s.grad_clip >= 0:
        raise DomaingenError(f"--grad_clip must be non-negative (0: no clipping), got {s.grad_clip}")
    if s.batch_size < 1 or s.batch_size % s.mask_samples:
        raise DomaingenError(f"--batch_size must be a positive multiple of --mask_samples ({s.mask_samples}), "
                             f"got {s.batch_size}")


def parse_widths(text: str) -> tuple[int, ...]:
    """'800,800,64' -> (800, 800, 64); refuses, in one line, anything but positive integers."""
    try:
        widths = tuple(int(part) for part in text.split(","))
    except ValueError:
        widths = ()
    if not widths or any(w < 1 for w in widths):
        raise DomaingenError(f"--widths takes positive hidden-layer widths separated by commas (e.g. 800,800,64), "
                             f"got {text}")
    return widths


@dataclass
class TaskData:
    """One task's examples: float inputs [N, 784] (permuted_mnist_tasks standardises them; uint8 is scaled
    to [0, 1] per batch) and labels."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


@dataclass
class TransferState:
    """The network and the masks so far: per layer a weight [out, in] and a bias [out]; masks[p][l] is
    task p's binary mask of layer l's weight (bias_masks[p][l] its bias's, with mask_biases)."""

    weights: list[torch.Tensor]
    biases: list[torch.Tensor]
    masks: list[list[torch.Tensor]]
    bias_masks: list[list[torch.Tensor]]


def layer_shapes(widths: Sequence[int]) -> list[tuple[int, int]]:
    """(out, in) of every Linear layer: 784 -> widths -> 10."""
    sizes = [INPUTS, *widths, CLASSES]
    return [(sizes[i + 1], sizes[i]) for i in range(len(sizes) - 1)]


def layer_names(widths: Sequence[int]) -> list[str]:
    """'layer1 (784x800)', ...: each Linear layer by position and shape (in x out)."""
    return [f"layer{i + 1} ({n_in}x{n_out})" for i, (n_out, n_in) in enumerate(layer_shapes(widths))]


def default_init(widths: Sequence[int], seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Weights and biases of every layer as the authors' FeedforwardModel initialises them, drawn from
    `seed`: Xavier-normal weights with the ReLU gain (sqrt 2) for every layer a ReLU follows and gain 1
    for the output layer, biases zero."""
    generator = torch.Generator().manual_seed(seed)
    shapes = layer_shapes(widths)
    weights, biases = [], []
    for i, (n_out, n_in) in enumerate(shapes):
        gain = 1.0 if i == len(shapes) - 1 else nn.init.calculate_gain("relu")
        weights.append(nn.init.xavier_normal_(torch.empty(n_out, n_in), gain=gain, generator=generator))
        biases.append(torch.zeros(n_out))
    return weights, biases


def used_masks(masks: Sequence[Sequence[torch.Tensor]], n_layers: int, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per layer, the union of the given tasks' binary masks (all False when there are none)."""
    used = [torch.zeros_like(t, dtype=torch.bool) for t in like[:n_layers]]
    for task in masks:
        for l, m in enumerate(task):
            used[l] |= m
    return used


def reinitialise(current: Sequence[torch.Tensor], used: Sequence[torch.Tensor],
                 fresh: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per layer, `current` where `used` and `fresh` (a new default initialisation) everywhere else."""
    return [torch.where(u, c, f) for c, u, f in zip(current, used, fresh)]


def initial_logits(used: Sequence[torch.Tensor], used_init: float, new_init: float) -> list[torch.Tensor]:
    """Task p's starting logits: `used_init` on weights earlier tasks use, `new_init` on the others."""
    return [torch.where(u, torch.tensor(used_init), torch.tensor(new_init)).float() for u in used]


def grouped_forward(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Logits [K, n, 10] of inputs x [K, n, 784] through layers whose weights [K, out, in] (one per
    group) and biases ([K, out] or a shared [out]) are given; ReLU between layers."""
    h = x
    for l, (w, b) in enumerate(zip(weights, biases)):
        h = torch.baddbmm(b.unsqueeze(-2), h, w.transpose(1, 2))
        if l < len(weights) - 1:
            h = F.relu(h)
    return h


def masked_forward(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Logits [n, 10] of x [n, 784] through fixed (already masked) weights [out, in] and biases [out]."""
    h = x
    for l, (w, b) in enumerate(zip(weights, biases)):
        h = F.linear(h, w, b)
        if l < len(weights) - 1:
            h = F.relu(h)
    return h


def task_accuracy(state: TransferState, task: int, x: torch.Tensor, y: torch.Tensor) -> float:
    """Accuracy on (x, y) of the network with task `task`'s binary masks."""
    weights = [w * m for w, m in zip(state.weights, state.masks[task])]
    biases = ([b * m for b, m in zip(state.biases, state.bias_masks[task])] if state.bias_masks
              else list(state.biases))
    correct = 0
    with torch.no_grad():
        for start in range(0, len(y), EVAL_CHUNK):
            inputs = _as_float(x[start:start + EVAL_CHUNK])
            correct += int((masked_forward(weights, biases, inputs).argmax(1) == y[start:start + EVAL_CHUNK]).sum())
    return correct / len(y) if len(y) else float("nan")


def _as_float(x: torch.Tensor) -> torch.Tensor:
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x


def sharing_statistics(masks: Sequence[Sequence[torch.Tensor]], task: int) -> dict[str, object]:
    """Task `task`'s mask against the union of the earlier ones, per layer (lists over layers) and in total.

    shared: |M_p & U| / |M_p| with U = M_0 | ... | M_{p-1} (NaN for p = 0 or an empty M_p);
    kept_fraction: |M_p| / weights; used_fraction: |U | M_p| / weights (the weights tasks 0..p use);
    the _total fields: the same over all layers; kept_weights: |M_p| per layer.
    """
    own = masks[task]
    earlier = used_masks(masks[:task], len(own), own)
    kept = [int(m.sum()) for m in own]
    both = [int((m & u).sum()) for m, u in zip(own, earlier)]
    sizes = [m.numel() for m in own]
    used = [int((m | u).sum()) for m, u in zip(own, earlier)]
    return {
        "shared": [b / k if k and task else float("nan") for b, k in zip(both, kept)],
        "shared_total": sum(both) / sum(kept) if sum(kept) and task else float("nan"),
        "kept_fraction": [k / n for k, n in zip(kept, sizes)],
        "kept_total": sum(kept) / sum(sizes),
        "used_fraction": [u / n for u, n in zip(used, sizes)],
        "used_total": sum(used) / sum(sizes),
        "kept_weights": kept,
    }


def _batches(n: int, batch_size: int, generator: torch.Generator):
    """Index batches of size `batch_size` over successive random orders of range(n)."""
    order, at = torch.randperm(n, generator=generator), 0
    while True:
        if at + batch_size > len(order):
            order, at = torch.cat([order[at:], torch.randperm(n, generator=generator)]), 0
        yield order[at:at + batch_size]
        at += batch_size


def mask_loss(logits: Sequence[torch.Tensor], settings: TransferSettings) -> torch.Tensor:
    """The mask regulariser as the authors' trainer adds it: alpha times the sum of the logits, divided by
    the batch size (their train_step divides the mask loss by it, so alpha 0.00128 weighs each logit
    by 1e-5 against the mean cross-entropy at batch 128)."""
    return settings.alpha * sum(l.sum() for l in logits) / settings.batch_size


def train_task(state: TransferState, task: int, data: TaskData, settings: TransferSettings) -> None:
    """Task `task`: reinitialise the unused weights, train the free weights and the task's mask, and
    append its binary masks to `state` (everything drawn from seed * SEED_STRIDE + task)."""
    s = settings
    seed = s.seed * SEED_STRIDE + task
    n_layers = len(state.weights)
    used = used_masks(state.masks, n_layers, state.weights)
    fresh_w, fresh_b = default_init(s.widths, seed)
    weights = [w.requires_grad_(True) for w in reinitialise(state.weights, used, fresh_w)]
    free = [(~u).float() for u in used]
    logits = [l.requires_grad_(True) for l in initial_logits(used, s.mask_used_init, s.mask_new_init)]
    trained = list(weights) + list(logits)
    if s.mask_biases:
        used_b = used_masks(state.bias_masks, n_layers, state.biases)
        biases = [b.requires_grad_(True) for b in reinitialise(state.biases, used_b, fresh_b)]
        free += [(~u).float() for u in used_b]
        bias_logits = [l.requires_grad_(True) for l in initial_logits(used_b, s.mask_used_init, s.mask_new_init)]
        trained += biases + bias_logits
        frozen_grads = list(weights) + biases
    else:
        biases = [b.requires_grad_(task == 0) for b in (fresh_b if task == 0 else state.biases)]
        bias_logits = []
        trained += biases if task == 0 else []
        frozen_grads = list(weights)
    optimizer = torch.optim.Adam(trained, lr=s.lr)
    torch.manual_seed(seed)
    batches = _batches(len(data.train_y), s.batch_size, torch.Generator().manual_seed(seed))
    k = s.mask_samples
    for _ in range(s.steps):
        index = next(batches)
        x = _as_float(data.train_x[index]).view(k, -1, INPUTS)
        masked_w = [w * sample_hard_masks(l, k) for w, l in zip(weights, logits)]
        masked_b = [b * sample_hard_masks(l, k) for b, l in zip(biases, bias_logits)] or biases
        out = grouped_forward(masked_w, masked_b, x)
        loss = F.cross_entropy(out.reshape(-1, CLASSES), data.train_y[index]) + mask_loss(logits + bias_logits, s)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for p, f in zip(frozen_grads, free):
            p.grad.mul_(f)  # with a fresh Adam and zero gradients from the start, the frozen weights never move
        if s.grad_clip:  # after the freezing, so frozen weights' gradients do not count in the norm
            torch.nn.utils.clip_grad_norm_(trained, s.grad_clip)
        optimizer.step()
    state.weights = [w.detach() for w in weights]
    state.biases = [b.detach() for b in biases]
    state.masks.append([l.detach() > 0 for l in logits])
    if s.mask_biases:
        state.bias_masks.append([l.detach() > 0 for l in bias_logits])


def run_transfer(settings: TransferSettings, task_data: Callable[[int], TaskData],
                 observer: Callable[[int, TransferState], None] | None = None) -> dict[str, object]:
    """The whole experiment: tasks 0..T-1 in turn; returns the JSON record (settings, layers, one entry per task).

    `task_data(p)` gives task p's examples (called once per task; test sets are kept for later
    tasks' measurements); `observer(p, state)` is called after task p's measurements.
    """
    check_settings(settings)
    shapes = layer_shapes(settings.widths)
    state = TransferState([torch.zeros(shape) for shape in shapes], [torch.zeros(shape[0]) for shape in shapes], [], [])
    tests: list[tuple[torch.Tensor, torch.Tensor]] = []
    entries = []
    started = time.perf_counter()
    for task in range(settings.tasks):
        task_started = time.perf_counter()
        data = task_data(task)
        tests.append((data.test_x, data.test_y))
        train_task(state, task, data, settings)
        entry = {"task": task, **sharing_statistics(state.masks, task)}
        entry["accuracy"] = task_accuracy(state, task, *tests[task])
        entry["earlier_accuracy"] = [task_accuracy(state, q, *tests[q]) for q in range(task)]
        entry["seconds"] = time.perf_counter() - task_started
        entries.append(entry)
        log.info("task %d: accuracy %.4f, shared %.4f, kept %.4f (%.1f s)", task, entry["accuracy"],
                 entry["shared_total"], entry["kept_total"], entry["seconds"])
        if observer is not None:
            observer(task, state)
    return {
        "experiment": "mask_transfer",
        "settings": settings.as_dict(),
        "layers": layer_names(settings.widths),
        "weights_per_layer": [o * i for o, i in shapes],
        "tasks": entries,
        "accuracy_when_trained": [e["accuracy"] for e in entries],
        "accuracy_after_last_task": entries[-1]["earlier_accuracy"] + [entries[-1]["accuracy"]],
        "seconds": time.perf_counter() - started,
    }


def permuted_mnist_tasks(data_dir: str, train_examples: int | None = None,
                         test_examples: int | None = None) -> tuple[Callable[[int], TaskData], str]:
    """(task p -> MNIST with PermutedMNIST's permutation p, the data source). Full MNIST: its 60,000
    training and 10,000 test digits; another source (the embedded sample), shuffled once: its last
    seventh as the test set. `train_examples` / `test_examples` keep the first that many of each.
    Pixels are standardised by the kept training digits' mean and standard deviation."""
    from domaingen.datasets.mnist import load_mnist
    from domaingen.datasets.permuted_mnist import pixel_permutation

    for flag, value in (("--train_examples", train_examples), ("--test_examples", test_examples)):
        if value is not None and value < 1:
            raise DomaingenError(f"{flag} must be positive, got {value}")
    digits = load_mnist(data_dir)
    n = len(digits.labels)
    images, labels = digits.images.flatten(1), digits.labels
    n_train = 60000 if n == 70000 else n - n // 7
    if n != 70000:  # the embedded sample is sorted by class: shuffle it once (DATA_SEED 0) before splitting
        order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
        images, labels = images[order], labels[order]
    train = slice(0, min(n_train, train_examples or n_train))
    test = slice(n_train, n_train + min(n - n_train, test_examples or n))
    # the authors standardise pixels by the training images' mean and standard deviation (one channel;
    # a permutation leaves both unchanged)
    pixels = images[train].float().div_(255.0)
    mean, std = float(pixels.mean()), float(pixels.std())
    images = images.float().div_(255.0).sub_(mean).div_(std)

    def task(p: int) -> TaskData:
        order = pixel_permutation(p)
        return TaskData(images[train][:, order].contiguous(), labels[train],
                        images[test][:, order].contiguous(), labels[test])

    return task, f"{digits.source} (train {train.stop - train.start}, test {test.stop - test.start})"
