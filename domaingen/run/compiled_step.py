"""`--compile_step`: the training update through torch.compile, as inductor kernels or as CUDA graphs.

- `off` (the default): the eager update.
- `inductor`: the algorithm's `update` through `torch.compile(dynamic=False)`. Dynamo splits it
  where it cannot trace (the backward call, `loss.item()`): the forward and the loss become one
  graph whose backward AOTAutograd compiles too, and the optimizer step another, so inductor
  fuses the memory-bound layers (ReLU, GroupNorm, Adam's element-wise arithmetic).
- `cudagraphs`: the same through `mode="reduce-overhead"`, which also records each graph as a
  CUDA graph and replays it, removing the per-kernel launch cost of a small network's step.
  CUDA only: elsewhere the run warns once and trains eagerly.

Only algorithms whose update has static shapes are compiled (`Algorithm.EAGER_STEP`, read by
`eager_step_reason`); the others train eagerly after one warning naming why. A run's training
batches have a fixed size at every step (the in-memory samplers and the image loaders draw
`batch_size` examples per environment with replacement, or the whole environment with
`full_batch`), so the graphs compile once, in the first steps; a Python value that changes
during a run (a penalty weight switching on after annealing) compiles once more when it changes.

If compilation fails (no C++ compiler, an operation dynamo cannot capture), one warning names the
reason and the run goes on eagerly. A failure within the first GUARDED_CALLS updates, where
compilation happens, leaves the model, its optimizers and the random generators as they were
before that update (they are restored from a copy), so the eager update that replaces it gives
the eager result.

The compiled step keeps the model's memory format: image models train channels-last (see
`devices.place_model`); MNIST_CNN measured slower channels-last as a CUDA graph on an H100
(2.26-2.44 ms against 1.97-2.02 ms a step), so nothing here changes the format.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Callable, Mapping

import torch

from domaingen.algorithms.base import Algorithm, Minibatches, eager_step_reason

log = logging.getLogger(__name__)

OFF, INDUCTOR, CUDAGRAPHS = "off", "inductor", "cudagraphs"
COMPILE_STEP_CHOICES = (OFF, INDUCTOR, CUDAGRAPHS)
# updates run with a copy of the state to fall back to: the first compiles the forward, backward and
# optimizer graphs, the second the optimizer step that finds Adam's state, the third is spare
GUARDED_CALLS = 3

Update = Callable[[Minibatches], Mapping[str, Any]]


def step_update(update: Update, algorithm: Algorithm, mode: str, device: torch.device) -> Update:
    """What the training loop calls for one step under compile_step `mode`: `update` itself for
    `off`, and for an algorithm or device that cannot compile it (after one warning saying why);
    else a `CompiledUpdate`."""
    if mode == OFF:
        return update
    reason = eager_step_reason(type(algorithm))
    if reason:
        log.warning("--compile_step %s: %s trains eagerly: %s", mode, type(algorithm).__name__, reason)
        return update
    if mode == CUDAGRAPHS and device.type != "cuda":
        log.warning("--compile_step cudagraphs records CUDA graphs, which need a CUDA device, but this run trains "
                    "on %s; training eagerly", device)
        return update
    return CompiledUpdate(update, algorithm, mode)


class _ExpectedNotices(logging.Filter):
    """Drops torch's notices about what an update does by design: `loss.item()` ends a graph (the update
    returns Python floats), and the optimizer's profiler annotations are left out of the graphs."""

    NOTICES = ("Graph break from `Tensor.item()`", "Profiler record function")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).lstrip().startswith(self.NOTICES)


_EXPECTED_NOTICES = _ExpectedNotices()
# the loggers of torch's modules that emit those notices (once per process each)
_NOTICE_LOGGERS = ("torch._dynamo.variables.tensor", "torch._dynamo.variables.ctx_manager")


def _quiet_expected_notices() -> None:
    for name in _NOTICE_LOGGERS:
        logger = logging.getLogger(name)
        if _EXPECTED_NOTICES not in logger.filters:
            logger.addFilter(_EXPECTED_NOTICES)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class CompiledUpdate:
    """`update` through torch.compile (`inductor`) or as CUDA graphs (`cudagraphs`), with an eager fallback.

    Called like the update; see the module docstring for what is compiled and what a failure does.
    """

    def __init__(self, update: Update, algorithm: Algorithm, mode: str) -> None:
        self.update = update
        self.algorithm = algorithm
        self.mode = mode
        self.calls = 0
        self.compiled: Update | None = None
        _quiet_expected_notices()
        try:
            self.compiled = torch.compile(update, dynamic=False,
                                          mode="reduce-overhead" if mode == CUDAGRAPHS else None)
        except Exception as exc:  # torch.compile refuses this Python or platform before compiling anything
            self._give_up(exc)

    def _give_up(self, exc: BaseException) -> None:
        log.warning("torch.compile failed for the training step (%s); training without it", _first_line(exc))
        self.compiled = None

    def __call__(self, minibatches: Minibatches) -> Mapping[str, Any]:
        if self.compiled is None:
            return self.update(minibatches)
        saved = _saved_state(self.algorithm) if self.calls < GUARDED_CALLS else None
        self.calls += 1
        try:
            if self.mode == CUDAGRAPHS:
                # a new step: the previous step's graph outputs (losses, gradients) may be overwritten
                torch.compiler.cudagraph_mark_step_begin()
            return self.compiled(minibatches)
        except Exception as exc:  # any compiler failure; a genuine error recurs in the eager update below
            self._give_up(exc)
            if saved is not None:
                _restore(self.algorithm, saved)
            return self.update(minibatches)


def _saved_state(algorithm: Algorithm) -> dict[str, Any]:
    """A copy of what an update changes: the weights and buffers, the optimizers' states, the random generators."""
    return {
        "algorithm": copy.deepcopy(algorithm.checkpoint_state()),
        "cpu_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
    }


def _restore(algorithm: Algorithm, saved: Mapping[str, Any]) -> None:
    algorithm.load_checkpoint_state(saved["algorithm"])
    for optimizer in algorithm.optimizers().values():
        for param in (p for group in optimizer.param_groups for p in group["params"]):
            param.grad = None
    torch.set_rng_state(saved["cpu_rng"])
    if saved["cuda_rng"] is not None:
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
