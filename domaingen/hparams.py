"""Hyperparameters: declared beside their class, drawn reproducibly.

Each algorithm and dataset declares `HPARAMS = {name: HParam(default, sampler)}`.
A run's values depend on (dataset, hparams_seed, name) only, never on the trial
seed and never on the algorithm: two algorithms that share a name (lr,
batch_size, mlp_width, ...) draw the same value at the same hparams_seed, so
draw k of ERM and of IRM differ only in what IRM adds (as in DomainBed). Every
name draws from its own seeded generator, so adding a hyperparameter never
changes the draws of the others. hparams_seed 0 gives the defaults (DomainBed's
convention).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping, Sequence, Union

import numpy as np

from domaingen.errors import DomaingenError


class HParamError(DomaingenError):
    """A bad hyperparameter override."""


# A sampler draws from numpy's Generator (the paired protocol's draws) or from a legacy
# RandomState (the domainbed protocol's, as DomainBed's registry draws): both have uniform().
Rng = Union[np.random.Generator, np.random.RandomState]


def random_index(r: Rng, n: int) -> int:
    """A uniform index below `n`: Generator.integers, or what RandomState.choice draws over n items."""
    return int(r.integers(n)) if isinstance(r, np.random.Generator) else int(r.randint(n))


@dataclass(frozen=True)
class Sampler:
    """A random-search distribution with a human-readable description."""

    draw: Callable[[Rng], Any]
    description: str

    def __call__(self, rng: Rng) -> Any:
        return self.draw(rng)

    def __str__(self) -> str:
        return self.description


def _check_range(name: str, low: float, high: float) -> None:
    """Refuse bounds in the wrong order (every sampler) with one line."""
    if not low <= high:
        raise HParamError(f"{name}({low:g}, {high:g}): low must not exceed high")


def _check_exponents(name: str, low: float, high: float, base: int) -> None:
    """Refuse bounds that look like values instead of exponents: both in (0, 1), e.g. 1e-4 and 1e-2."""
    _check_range(name, low, high)
    if 0 < low < 1 and 0 < high < 1:
        log = math.log10 if base == 10 else math.log2
        raise HParamError(
            f"{name}({low:g}, {high:g}) takes exponents of {base}, not values: {low:g} and {high:g} would draw "
            f"between {base ** low:.3g} and {base ** high:.3g}; for values between {low:g} and {high:g} write "
            f"{name}({log(low):.3g}, {log(high):.3g})"
        )


def log_uniform(low: float, high: float) -> Sampler:
    """10 ** U(low, high): log-uniform between 10**low and 10**high.

    Args:
        low, high: exponents of 10, not values: `log_uniform(-4, -2)` draws between 1e-4
            and 1e-2 (DomainBed's `10**r.uniform(-4, -2)`). Bounds both in (0, 1) look
            like values and are refused.
    """
    _check_exponents("log_uniform", low, high, 10)
    return Sampler(lambda r: float(10 ** r.uniform(low, high)), f"10^U({low:g},{high:g})")


def log_uniform_or_zero(low: float, high: float, p_zero: float) -> Sampler:
    """0 with probability `p_zero`, else 10 ** U(low, high): a log-uniform range that includes 0.

    Args:
        low, high: exponents of 10, as for `log_uniform` (`-5, 0`: between 1e-5 and 1).
        p_zero: the probability of drawing exactly 0, in [0, 1].
    """
    _check_exponents("log_uniform_or_zero", low, high, 10)
    if not 0 <= p_zero <= 1:
        raise HParamError(f"log_uniform_or_zero: p_zero is a probability in [0, 1], got {p_zero:g}")

    def draw(r: Rng) -> float:
        zero, exponent = r.uniform(), r.uniform(low, high)  # both always drawn: p_zero moves no other value
        return 0.0 if zero < p_zero else float(10**exponent)

    return Sampler(draw, f"0 w.p. {p_zero:g}, else 10^U({low:g},{high:g})")


def int_log_uniform(low: float, high: float) -> Sampler:
    """int(10 ** U(low, high)): an integer, log-uniform (DomainBed's penalty anneal iterations).

    Args:
        low, high: exponents of 10: `int_log_uniform(0, 4)` draws integers from 1 to 9999.
    """
    _check_exponents("int_log_uniform", low, high, 10)
    return Sampler(lambda r: int(10 ** r.uniform(low, high)), f"int(10^U({low:g},{high:g}))")


def int_pow2_uniform(low: float, high: float) -> Sampler:
    """int(2 ** U(low, high)), DomainBed's batch-size distribution.

    Args:
        low, high: exponents of 2: `int_pow2_uniform(3, 9)` draws integers from 8 to 511.
    """
    _check_exponents("int_pow2_uniform", low, high, 2)
    return Sampler(lambda r: int(2 ** r.uniform(low, high)), f"int(2^U({low:g},{high:g}))")


def uniform(low: float, high: float) -> Sampler:
    """U(low, high): uniform between two values.

    Args:
        low, high: the values themselves (`uniform(0.0, 0.2)` draws between 0 and 0.2).
    """
    _check_range("uniform", low, high)
    return Sampler(lambda r: float(r.uniform(low, high)), f"U({low:g},{high:g})")


def choice(options: Sequence[Any]) -> Sampler:
    """One of `options`, uniformly.

    Args:
        options: the values to choose from (a non-empty sequence), e.g. `choice([0.0, 0.1, 0.5])`.
    """
    opts = list(options)
    if not opts:
        raise HParamError("choice([]): give at least one option")
    return Sampler(lambda r: opts[random_index(r, len(opts))], "choice{" + ",".join(map(str, opts)) + "}")


@dataclass(frozen=True)
class HParam:
    """A hyperparameter: its default and, when it is searched, its sampler.

    `variants` holds other declarations for some datasets (see `by_dataset`): a
    selector is a dataset's registered name or one of its `HPARAM_GROUPS` (such as
    "small_images", DomainBed's 28x28 datasets); the first match wins.
    """

    default: Any
    sampler: Sampler | None = None
    help: str = ""
    variants: tuple[tuple[tuple[str, ...], "HParam"], ...] = ()

    def for_dataset(self, dataset: str, groups: Collection[str] = ()) -> "HParam":
        """The declaration that applies to `dataset` (whose hyperparameter groups are `groups`)."""
        for selectors, variant in self.variants:
            if dataset in selectors or any(group in selectors for group in groups):
                return variant
        return HParam(self.default, self.sampler, self.help) if self.variants else self

    def describe(self) -> str:
        """'default; distribution' as the `list` command shows it (other datasets' variants after it)."""
        text = f"{self.default!r}" + (f"; {self.sampler}" if self.sampler else "; fixed")
        for selectors, variant in self.variants:
            text += f" [{'/'.join(selectors)}: {variant.describe()}]"
        return text


def by_dataset(otherwise: HParam, *variants: tuple[str | Sequence[str], HParam]) -> HParam:
    """A hyperparameter declared differently for some datasets, as DomainBed's registry does.

    `by_dataset(HParam(5e-5, ...), ("small_images", HParam(1e-3, ...)), (("PACS", "VLCS"), ...))`:
    each variant names datasets or dataset groups; `otherwise` applies to the rest.
    """
    normalized = tuple(((sel,) if isinstance(sel, str) else tuple(sel), hp) for sel, hp in variants)
    return HParam(otherwise.default, otherwise.sampler, otherwise.help, normalized)


def resolve_space(space: Mapping[str, HParam], dataset: str, groups: Collection[str] = ()) -> dict[str, HParam]:
    """`space` with every dataset-dependent declaration replaced by the one for `dataset`."""
    return {name: hp.for_dataset(dataset, groups) for name, hp in space.items()}


def run_space(dataset: str, dataset_cls: Any, algorithm_cls: Any) -> dict[str, HParam]:
    """The hyperparameters of `algorithm_cls` on `dataset`: the dataset's, then the algorithm's
    (which win on a shared name), each resolved for the dataset and its `HPARAM_GROUPS`."""
    space = {**dataset_cls.hparam_space(), **algorithm_cls.hparam_space()}
    return resolve_space(space, dataset, getattr(dataset_cls, "HPARAM_GROUPS", ()))


def seed_hash(*parts: Any) -> int:
    """A stable 31-bit seed from any printable values (same on every machine and Python)."""
    digest = hashlib.md5(json.dumps([str(p) for p in parts]).encode()).hexdigest()
    return int(digest[:8], 16) & 0x7FFFFFFF


def domainbed_seed_hash(*parts: Any) -> int:
    """DomainBed's seed from values (its `misc.seed_hash`): the MD5 of the tuple's Python repr, modulo 2**31."""
    return int(hashlib.md5(str(tuple(parts)).encode("utf-8")).hexdigest(), 16) % (2**31)


def draw_hparams(space: Mapping[str, HParam], dataset: str, hparams_seed: int) -> dict[str, Any]:
    """The hyperparameters of one run: defaults for seed 0, else one random draw.

    Each name has its own generator seeded by (dataset, hparams_seed, name): the
    algorithm does not enter, so a name shared by two algorithms draws one value.
    """
    if hparams_seed < 0:
        raise HParamError(f"hparams_seed must be >= 0, got {hparams_seed}")
    values: dict[str, Any] = {}
    for name, hp in space.items():
        hp = hp.for_dataset(dataset)
        if hparams_seed == 0 or hp.sampler is None:
            values[name] = hp.default
        else:
            rng = np.random.default_rng(seed_hash(dataset, hparams_seed, name))
            values[name] = hp.sampler(rng)
    return values


def parse_overrides(text: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """Parse `--hparams` JSON (an object) into a dict."""
    if text is None or text == "":
        return {}
    if isinstance(text, Mapping):
        return dict(text)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HParamError(
            f"--hparams is not valid JSON ({exc.msg} at character {exc.pos}); "
            """write an object such as '{"lr": 1e-4}'"""
        ) from None
    if not isinstance(parsed, dict):
        raise HParamError("""--hparams must be a JSON object such as '{"lr": 1e-4}'""")
    return parsed


def apply_overrides(
    values: Mapping[str, Any], overrides: Mapping[str, Any], space: Mapping[str, HParam]
) -> dict[str, Any]:
    """Replace drawn values by user overrides; an unknown key is an error."""
    unknown = sorted(set(overrides) - set(space))
    if unknown:
        raise HParamError(
            f"unknown hyperparameter(s) {', '.join(unknown)}; valid names: {', '.join(sorted(space))}"
        )
    merged = dict(values)
    for name, value in overrides.items():
        default = space[name].default
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise HParamError(f"hyperparameter '{name}' must be a finite number, got {value!r}")
        merged[name] = value
    return merged


# The values of `fc_loss` (declared by FeatureContamination for the setting of Zhang et al.'s theorem,
# read by algorithms.base): the logistic and hinge losses read one output logit.
LOSSES = ("cross_entropy", "logistic", "hinge")
ONE_LOGIT_LOSSES = ("logistic", "hinge")


def loss_name(hparams: Mapping[str, Any]) -> str:
    """The `fc_loss` hyperparameter in lower case (cross_entropy when absent)."""
    return str(hparams.get("fc_loss", "cross_entropy")).strip().lower()
