"""Weight averaging for any algorithm: `X+EMA` and `X+SWAD`.

Both are registry modifiers, like `X+ModReg`, rather than a `weight_averaging`
hyperparameter: the averaged method is then a row of its own in every table (`ERM+SWAD`
beside `ERM`), `--paired ERM+SWAD:ERM` compares them restart by restart, and `X+SWAD`
gets X's training seed (the same weights and minibatches), so the comparison is paired.
They compose with ModReg (`ERM+ModReg+SWAD`): mask logits are parameters, averaged like
the weights, and the averaged model is evaluated with the deterministic mask
1[sigmoid(l) > 0.5].

**What is averaged and what is evaluated.** Every floating-point parameter and buffer of
the algorithm. The averages are buffers of `weight_average`, so `checkpoint.pt` (resume
restores them exactly) and `selected.pt` hold them. In eval mode the algorithm shows the
averaged weights (they are swapped in by `train(False)` and out by `train(True)`), so the
training loop's evaluation, selection, `selected.pt`, `domaingen evaluate` and `diagnose`
all use the average; every record says which weights it evaluated (`weights_evaluated`).

**EMA** (`ema_decay`, default 0.999): after every step, avg <- decay * avg + (1 - decay) *
weights, starting from the weights after the first step; BatchNorm statistics are
averaged the same way. Every checkpoint evaluates the average.

**SWAD** (Cha et al., NeurIPS 2021, their LossValley rule and defaults): the weights after
every step are averaged densely in segments, one per checkpoint interval; at each
checkpoint the live model's training-domain validation loss (the mean over training
domains of each `out` split's mean cross-entropy) closes a segment. With N_s =
`swad_n_converge` (3), N_e = `swad_n_tolerance` (6) and r = `swad_tolerance_ratio` (0.3):
the window starts at the first segment that is the minimum of the N_s segments from it
(threshold = (1 + r) x their mean loss), reaching back over the segments before it whose
loss stays within the threshold; a segment then joins the average while the least loss of
the N_e segments from it stays within the threshold, and the valley is dead (the window
ends) at the first that does not. At the end, the remaining segments join under the same
rule. The average is a running mean over segments, exactly as SWAD's code computes it
(including its double count of the first segment of the window, kept for fidelity).
BatchNorm statistics of the average are then recomputed over `swad_bn_steps` (500)
training minibatches, for the BatchNorm layers that update during training (with
`freeze_bn` true they keep their pretrained statistics). Checkpoints before the end
evaluate the live model and record its accuracies as `live_env{i}_*` (with the
validation loss, `swad_val_loss`); the last record evaluates the SWAD average, so every
selection method selects it. Departure: SWAD stops training when the valley is dead;
here training runs its `steps` (the average is final by then) so runs stay comparable.
SWAD needs training-domain validation: with `holdout_fraction` 0 it is refused.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Mapping

import numpy as np
import torch
from torch import nn

from domaingen.algorithms.base import ALGORITHMS, Algorithm, Minibatches
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam

STORE = "weight_average"


def averaged_names(algorithm: nn.Module) -> list[str]:
    """The floating-point parameters and buffers of `algorithm` that are averaged (its own store left out)."""
    state = nn.Module.state_dict(algorithm, keep_vars=True)  # not the mixin's (it may swap)
    names, seen = [], set()
    for k, v in state.items():  # a module shared by two attributes (featurizer, network.0) is averaged once
        if not k.startswith(STORE + ".") and torch.is_floating_point(v) and id(v) not in seen:
            seen.add(id(v))
            names.append(k)
    return names


def _key(name: str) -> str:
    return name.replace(".", "__")


def live_tensors(algorithm: nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    """name -> the live parameter or buffer tensor (not a copy)."""
    state = nn.Module.state_dict(algorithm, keep_vars=True)  # not the mixin's (it may swap)
    return {name: state[name] for name in names}


def running_mean(average: torch.Tensor, value: torch.Tensor, n: int) -> None:
    """average <- average + (value - average) / (n + 1): the mean of n + 1 values, in place (SWA's rule)."""
    average.add_(value.to(average.dtype) - average, alpha=1.0 / (n + 1))


@dataclass
class Segment:
    """The mean of the weights over the steps start..end, and the validation loss that closed it."""

    start: int
    end: int
    loss: float
    weights: Any = None


@dataclass
class SegmentAverage:
    """A running mean over segments; the first update copies (SWAD's AveragedModel with n_averaged 0)."""

    weights: dict[str, torch.Tensor] | None = None
    n: int = 0
    start: int | None = None
    end: int | None = None

    def add(self, segment: Segment) -> None:
        if self.n == 0 or self.weights is None:
            self.weights = {k: v.clone() for k, v in segment.weights.items()} if isinstance(segment.weights, dict) \
                else segment.weights
            self.start = segment.start
        elif isinstance(self.weights, dict):
            for k, v in self.weights.items():
                running_mean(v, segment.weights[k], self.n)
        else:  # numbers (tests, and anything with + and /)
            self.weights = self.weights + (segment.weights - self.weights) / (self.n + 1)
        self.n += 1
        self.end = segment.end


@dataclass
class LossValley:
    """SWAD's window rule over segments (see the module docstring); segments arrive with `add`."""

    n_converge: int = 3
    n_tolerance: int = 6
    tolerance_ratio: float = 0.3
    converge_queue: list[Segment] = field(default_factory=list)
    smooth_queue: list[Segment] = field(default_factory=list)
    final: SegmentAverage | None = None
    converge_step: int | None = None
    dead: bool = False
    threshold: float | None = None
    used: list[tuple[int, int]] = field(default_factory=list)  # (start, end) of each segment averaged, in order

    def _push(self, segment: Segment) -> None:
        self.converge_queue = (self.converge_queue + [segment])[-self.n_converge:]
        self.smooth_queue = (self.smooth_queue + [segment])[-self.n_tolerance:]

    def _smooth_loss(self, start: int = 0) -> float:
        return min(s.loss for s in self.smooth_queue[start:])

    def _use(self, segment: Segment) -> None:
        assert self.final is not None
        self.final.add(segment)
        self.used.append((segment.start, segment.end))

    def add(self, segment: Segment) -> None:
        """Close one segment (SWAD's `update_and_evaluate`)."""
        if self.dead:
            return
        self._push(segment)
        if self.converge_step is None:
            if len(self.converge_queue) < self.n_converge:
                return
            losses = [s.loss for s in self.converge_queue]
            if int(np.argmin(losses)) != 0:
                return
            first = self.converge_queue[0]
            self.converge_step = first.end
            self.final = SegmentAverage(weights=first.weights)  # n 0: replaced by the first segment added
            self.threshold = float(np.mean(losses)) * (1.0 + self.tolerance_ratio)
            if self.n_tolerance < self.n_converge:
                for s in self.converge_queue[1:1 + self.n_converge - self.n_tolerance]:
                    self._use(s)
            elif self.n_tolerance > self.n_converge:
                back = self.smooth_queue[: self.n_tolerance - self.n_converge + 1]
                start = 0
                for i in reversed(range(len(back))):
                    if back[i].loss > self.threshold:
                        start = i + 1
                        break
                for s in back[start + 1:]:
                    self._use(s)
            return
        if self.smooth_queue[0].end < self.converge_step:
            return
        if self._smooth_loss() > self.threshold:
            self.dead = True
            return
        self._use(self.smooth_queue[0])

    def finish(self) -> SegmentAverage:
        """The final average (SWAD's `get_final_model`): before convergence, the last segment."""
        if self.converge_step is None or self.final is None:
            last = SegmentAverage()
            last.add(self.converge_queue[-1])
            self.used.append((self.converge_queue[-1].start, self.converge_queue[-1].end))
            return last
        if not self.dead:
            queue = self.smooth_queue[1:]
            while queue:
                if min(s.loss for s in queue) > self.threshold:
                    break
                self._use(queue.pop(0))
        return self.final


class WeightAveragingMixin:
    """Keeps an average of the algorithm's weights and shows it in eval mode; see the module docstring."""

    AVERAGING: ClassVar[str] = ""
    # the average exists only after training ends (SWAD): checkpoints before evaluate the live model
    AVERAGED_AT_END: ClassVar[bool] = False
    NEEDS_VALIDATION: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self._names = averaged_names(self)  # type: ignore[arg-type]
        store = nn.Module()
        live = live_tensors(self, self._names)  # type: ignore[arg-type]
        for name, tensor in live.items():
            store.register_buffer(_key(name), tensor.detach().clone())
        store.register_buffer("n_averaged", torch.zeros((), dtype=torch.long))
        store.register_buffer("first_step", torch.full((), -1, dtype=torch.long))
        store.register_buffer("last_step", torch.full((), -1, dtype=torch.long))
        store.register_buffer("steps_done", torch.zeros((), dtype=torch.long))
        self.weight_average = store
        self._showing_average = False

    # --- what eval mode shows ---

    def average_ready(self) -> bool:
        """Whether there is an average to show."""
        return int(self.weight_average.n_averaged) > 0

    def _swap(self) -> None:
        live = live_tensors(self, self._names)  # type: ignore[arg-type]
        with torch.no_grad():
            for name, tensor in live.items():
                stored = getattr(self.weight_average, _key(name))
                tensor.data, stored.data = stored.data, tensor.data
        self._showing_average = not self._showing_average

    def train(self, mode: bool = True):  # type: ignore[override]
        super().train(mode)  # type: ignore[misc]
        if not hasattr(self, "_showing_average"):
            return self
        if (not mode and self.average_ready()) != self._showing_average:
            self._swap()
        return self

    def state_dict(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        if getattr(self, "_showing_average", False):  # always the live weights in their own slots
            self._swap()
            try:
                return copy.deepcopy(super().state_dict(*args, **kwargs))  # type: ignore[misc]
            finally:
                self._swap()
        return super().state_dict(*args, **kwargs)  # type: ignore[misc]

    def load_state_dict(self, state: Mapping[str, Any], *args: Any, **kwargs: Any):  # type: ignore[override]
        showing = getattr(self, "_showing_average", False)
        if showing:
            self._swap()
        result = super().load_state_dict(state, *args, **kwargs)  # type: ignore[misc]
        if showing and self.average_ready():
            self._swap()
        return result

    # --- training ---

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        losses = super().update(minibatches)  # type: ignore[misc]
        step = int(self.weight_average.steps_done)
        self.weight_average.steps_done += 1
        with torch.no_grad():
            self.accumulate(step)
        return losses

    def accumulate(self, step: int) -> None:
        """Fold the weights after step `step` into the average."""
        raise NotImplementedError

    def _record_step(self, step: int) -> None:
        if int(self.weight_average.first_step) < 0:
            self.weight_average.first_step.fill_(step)
        self.weight_average.last_step.fill_(step)

    def weights_evaluated(self) -> str:
        """What eval mode shows, for the records."""
        raise NotImplementedError

    def diagnostics(self) -> dict[str, Any]:
        return {**super().diagnostics(), "weights_evaluated": self.weights_evaluated()}  # type: ignore[misc]


class EMAMixin(WeightAveragingMixin):
    """An exponential moving average of the weights, evaluated at every checkpoint."""

    AVERAGING = "EMA"
    HPARAMS = {"ema_decay": HParam(0.999, help="EMA decay: avg <- decay * avg + (1 - decay) * weights, every step")}

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any]) -> None:
        super().check_hparams(hparams)  # type: ignore[misc]
        if not 0.0 <= float(hparams["ema_decay"]) < 1.0:
            raise DomaingenError(f"ema_decay must be at least 0 and below 1, got {hparams['ema_decay']}")

    def accumulate(self, step: int) -> None:
        decay = float(self.hparams["ema_decay"])  # type: ignore[attr-defined]
        live = [t.detach() for t in live_tensors(self, self._names).values()]  # type: ignore[arg-type]
        stored = [getattr(self.weight_average, _key(name)) for name in self._names]
        if int(self.weight_average.n_averaged) == 0:
            torch._foreach_copy_(stored, live)
        else:  # avg + (1 - decay) (w - avg) = decay avg + (1 - decay) w, one fused pass over every tensor
            torch._foreach_lerp_(stored, live, 1.0 - decay)
        self.weight_average.n_averaged += 1
        self._record_step(step)

    def weights_evaluated(self) -> str:
        if not self.average_ready():
            return "live"
        return (f"EMA (decay {float(self.hparams['ema_decay']):g}) of steps "  # type: ignore[attr-defined]
                f"{int(self.weight_average.first_step)}..{int(self.weight_average.last_step)}")


class SWADMixin(WeightAveragingMixin):
    """SWAD: dense averaging inside a window chosen from the training-domain validation loss."""

    AVERAGING = "SWAD"
    AVERAGED_AT_END = True
    NEEDS_VALIDATION = True
    HPARAMS = {
        "swad_n_converge": HParam(3, help="SWAD's N_s: segments that must follow a minimum for the window to start"),
        "swad_n_tolerance": HParam(6, help="SWAD's N_e: segments over which the least loss must stay within tolerance"),
        "swad_tolerance_ratio": HParam(0.3, help="SWAD's r: threshold = (1 + r) x the mean loss of the N_s segments"),
        "swad_bn_steps": HParam(500, help="training minibatches over which the average's BatchNorm statistics are recomputed"),
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._segment: dict[str, torch.Tensor] | None = None
        self._segment_n = 0
        self._segment_start = 0
        self.valley = self._new_valley()
        self.weight_average.register_buffer("finished", torch.zeros((), dtype=torch.bool))

    def _new_valley(self) -> LossValley:
        h = self.hparams  # type: ignore[attr-defined]
        return LossValley(int(h["swad_n_converge"]), int(h["swad_n_tolerance"]), float(h["swad_tolerance_ratio"]))

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any]) -> None:
        super().check_hparams(hparams)  # type: ignore[misc]
        for key in ("swad_n_converge", "swad_n_tolerance"):
            if int(hparams[key]) < 1:
                raise DomaingenError(f"{key} must be at least 1, got {hparams[key]}")

    def average_ready(self) -> bool:
        return int(self.weight_average.n_averaged) > 0 and bool(getattr(self.weight_average, "finished", False))

    def accumulate(self, step: int) -> None:
        live = live_tensors(self, self._names)  # type: ignore[arg-type]
        if self._segment is None:
            self._segment = {k: v.detach().clone() for k, v in live.items()}
            self._segment_n, self._segment_start = 1, step
            return
        # the running mean of the segment, one fused pass: avg + (w - avg) / (n + 1)
        torch._foreach_lerp_(list(self._segment.values()), [live[k].detach() for k in self._segment],
                             1.0 / (self._segment_n + 1))
        self._segment_n += 1

    def close_segment(self, step: int, validation_loss: float) -> None:
        """End the current segment at `step` with the live model's training-domain validation loss."""
        if self._segment is None:
            return
        weights = {k: v.cpu() for k, v in self._segment.items()}  # SWAD keeps closed segments off the device
        self.valley.add(Segment(self._segment_start, step, float(validation_loss), weights))
        self._segment, self._segment_n = None, 0

    def finish_averaging(self, batches: Iterator[Minibatches]) -> None:
        """Build SWAD's final average and recompute its BatchNorm statistics over training minibatches."""
        final = self.valley.finish()
        with torch.no_grad():
            for name in self._names:
                stored = getattr(self.weight_average, _key(name))
                stored.copy_(final.weights[name].to(stored.device, stored.dtype))
        self.weight_average.n_averaged.fill_(max(final.n, 1))
        self.weight_average.first_step.fill_(int(final.start if final.start is not None else -1))
        self.weight_average.last_step.fill_(int(final.end if final.end is not None else -1))
        self.weight_average.finished.fill_(True)
        self._recompute_batchnorm(batches)

    @torch.no_grad()
    def _recompute_batchnorm(self, batches: Iterator[Minibatches]) -> None:
        self.train()  # type: ignore[attr-defined]
        updating = [m for m in self.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)  # type: ignore[attr-defined]
                    and m.training and m.track_running_stats]
        if not updating:
            return
        self._swap()  # the average's weights, with the BatchNorm layers in training mode
        try:
            momenta = {}
            for module in updating:
                module.reset_running_stats()
                momenta[module] = module.momentum
                module.momentum = None  # a cumulative mean over the minibatches
            for _ in range(int(self.hparams["swad_bn_steps"])):  # type: ignore[attr-defined]
                minibatches = next(batches)
                self.predict(torch.cat([x for x, _ in minibatches]))  # type: ignore[attr-defined]
            for module, momentum in momenta.items():
                module.momentum = momentum
        finally:
            self._swap()  # the recomputed statistics now sit in the store

    def checkpoint_state(self) -> dict[str, Any]:
        state = super().checkpoint_state()  # type: ignore[misc]
        valley = self.valley
        state["swad"] = {
            "segment": self._segment, "segment_n": self._segment_n, "segment_start": self._segment_start,
            "valley": {k: getattr(valley, k) for k in ("converge_queue", "smooth_queue", "final", "converge_step",
                                                       "dead", "threshold", "used")},
        }
        return state

    def load_checkpoint_state(self, state: Mapping[str, Any]) -> None:
        super().load_checkpoint_state(state)  # type: ignore[misc]
        swad = copy.deepcopy(state["swad"])
        self._segment, self._segment_n, self._segment_start = swad["segment"], swad["segment_n"], swad["segment_start"]
        self.valley = self._new_valley()
        for key, value in swad["valley"].items():
            setattr(self.valley, key, value)

    def weights_evaluated(self) -> str:
        if not self.average_ready():
            return "live"
        first, last = int(self.weight_average.first_step), int(self.weight_average.last_step)
        note = "" if self.valley.converge_step is not None else " (the loss never converged: the last segment)"
        return f"SWAD average of steps {first}..{last}{note}"


def _compose(mixin: type, suffix: str):
    def compose(base: type[Algorithm]) -> type[Algorithm]:
        if base.NO_WEIGHT_AVERAGING:
            raise DomaingenError(f"{suffix} cannot be composed with {base.__name__}: {base.NO_WEIGHT_AVERAGING}")
        return type(f"{base.__name__}{suffix}", (mixin, base),
                    {"__doc__": f"{base.__name__} with {suffix} weight averaging; see domaingen.algorithms.averaging."})
    return compose


ALGORITHMS.register_modifier("EMA", _compose(EMAMixin, "EMA"))
ALGORITHMS.register_modifier("SWAD", _compose(SWADMixin, "SWAD"))
