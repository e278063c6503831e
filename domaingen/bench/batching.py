"""`bench --only batching`: would training N runs in one process, stacked and vmapped, be faster?

N models of one architecture (the ColoredMNIST MLP, or MNIST_CNN), each with its own
weights, Adam state and minibatch (64 per environment x 2), take one training step
either one after another (N ordinary steps) or together: `torch.func.stack_module_state`
stacks their parameters, `vmap(grad(loss))` computes every model's gradients in one call,
and a foreach Adam updates the stacked tensors. The two alternate and their medians are
compared. This decides whether domaingen should batch runs (results/batching.md).
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Callable

import torch
from torch import nn

from domaingen.algorithms.base import classification_loss
from domaingen.networks import MNIST_CNN

BATCH = 128  # 64 per environment x 2


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(2 * 14 * 14, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))


def _cnn() -> nn.Module:
    return nn.Sequential(MNIST_CNN((2, 28, 28)), nn.Linear(128, 2))


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "MLP": (_mlp, (2, 14, 14)),
    "MNIST_CNN": (_cnn, (2, 28, 28)),
}


class StackedAdam:
    """One Adam step of N models at once: x is N x batch x ..., y is N x batch; `params` holds the
    stacked weights (name -> N x ...), updated in place."""

    def __init__(self, models: list[nn.Module], lr: float = 1e-3) -> None:
        from torch.func import functional_call, grad, stack_module_state, vmap

        self.params, self.buffers = stack_module_state(models)
        skeleton = copy.deepcopy(models[0]).to("meta")

        def loss(p, b, x, y):
            return classification_loss(functional_call(skeleton, (p, b), (x,)), y)

        self.gradients = vmap(grad(loss))
        self.lr, self.count = lr, 0
        self.first = [torch.zeros_like(t) for t in self.params.values()]
        self.second = [torch.zeros_like(t) for t in self.params.values()]

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.count += 1
        g = self.gradients(self.params, self.buffers, x, y)
        g = [g[name] for name in self.params]
        torch._foreach_lerp_(self.first, g, 0.1)
        torch._foreach_mul_(self.second, 0.999)
        torch._foreach_addcmul_(self.second, g, g, value=0.001)
        denom = torch._foreach_sqrt(torch._foreach_div(self.second, 1 - 0.999 ** self.count))
        torch._foreach_add_(denom, 1e-8)
        with torch.no_grad():
            torch._foreach_addcdiv_(list(self.params.values()), self.first, denom,
                                    value=-self.lr / (1 - 0.9 ** self.count))


def bench_batching(model: str = "MLP", sizes: tuple[int, ...] = (1, 4, 8), repeats: int = 15,
                   device: torch.device | None = None) -> list[list]:
    """Per N: N sequential steps against one stacked step, medians of alternating repeats
    (on `device`, default the auto-detected one)."""
    from domaingen.devices import resolve_device

    device = device or resolve_device("auto")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    make, shape = MODELS[model]
    rows = []
    for n in sizes:
        torch.manual_seed(0)
        models = [make().to(device) for _ in range(n)]
        x = torch.randn(n, BATCH, *shape, device=device)
        y = torch.randint(0, 2, (n, BATCH), device=device)
        optimizers = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in models]

        def sequential() -> None:
            for m, opt, xi, yi in zip(models, optimizers, x, y):
                opt.zero_grad()
                classification_loss(m(xi), yi).backward()
                opt.step()

        batched = StackedAdam(models)
        times: dict[str, list[float]] = {"sequential": [], "stacked": []}
        for i in range(repeats + 2):
            for name, run in (("sequential", sequential), ("stacked", lambda: batched(x, y))):
                sync()
                start = time.perf_counter()
                run()
                sync()
                if i >= 2:  # warm-up
                    times[name].append(time.perf_counter() - start)
        seq, stacked = statistics.median(times["sequential"]), statistics.median(times["stacked"])
        rows.append([f"{n} x {model} step on {device.type}, sequential / stacked (vmap)",
                     f"{seq * 1000:.1f} ms / {stacked * 1000:.1f} ms = {seq / stacked:.2f}x"])
    return rows
