"""Every algorithm in the table passes these tests automatically: the built-in ones, their
compositions, and the example plugin's LabelSmoothing (tests/example_plugin), loaded here as
a user's plugin. The checks themselves are public, in domaingen.testing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from domaingen.algorithms import ALGORITHMS
from domaingen.errors import DomaingenError
from domaingen import plugins
from domaingen.plugins import load_plugin
from domaingen.testing import (  # noqa: F401  (build, default_hparams, separable_batches: other tests import them here)
    INPUT_SHAPES,
    NUM_DOMAINS,
    build,
    check_builds_updates_and_predicts,
    check_checkpoint_round_trip,
    check_equal_seeds,
    check_loss_falls,
    default_hparams,
    separable_batches,
)

EXAMPLE_PLUGIN_SRC = Path(__file__).parent / "example_plugin" / "src"
if str(EXAMPLE_PLUGIN_SRC) not in sys.path:
    sys.path.insert(0, str(EXAMPLE_PLUGIN_SRC))
load_plugin("domaingen_example_plugin")  # registers LabelSmoothing for the whole session
# ... but is not recorded as loaded: sweep jobs of other tests (Slurm's and Ray's processes do not
# share this sys.path) must not be asked to import it
plugins.forget("domaingen_example_plugin")



def _composes(name: str) -> bool:
    """Whether the registry builds the composition `name` (X+ModReg is refused for an X that
    declares NO_ADDITIVE_PENALTY)."""
    try:
        ALGORITHMS.get(name)
    except DomaingenError:
        return False
    return True


# Modifiers that change what the base algorithm's update optimises are checked on every base
# (X+ModReg adds to each objective); the weight-averaging ones only wrap the steps of an update
# they leave alone, so a few bases of different kinds show them (their own tests:
# tests/test_averaging.py), which keeps the suite within its time.
WRAPPING_MODIFIERS = {"EMA", "SWAD"}
WRAPPED_BASES = {"ERM", "IRM", "DANN", "LabelSmoothing"}


def _checked(name: str) -> bool:
    base, _, modifier = name.rpartition("+")
    return modifier not in WRAPPING_MODIFIERS or base in WRAPPED_BASES


# every registered algorithm, and every composition such as X+ModReg that is not refused
ALL_ALGORITHMS = ALGORITHMS.names() + [
    name for name in ALGORITHMS.composed_names() if _composes(name) and _checked(name)
]


def test_the_example_plugin_is_in_the_table():
    assert "LabelSmoothing" in ALL_ALGORITHMS and "LabelSmoothing+ModReg" in ALL_ALGORITHMS
    assert ALGORITHMS.owners()["LabelSmoothing"] == "domaingen_example_plugin"


@pytest.mark.parametrize("shape", INPUT_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", ALL_ALGORITHMS)
def test_builds_updates_and_predicts(name, shape):
    check_builds_updates_and_predicts(name, shape)


# Algorithms whose DomainBed defaults cannot pass the loss-falls check, and why (each file of
# specific tests shows the method learning with other values).
LOSS_STAYS = {
    "IGA": "DomainBed's penalty weights (>= 10) pin the gradients of 16-example batches to their mean: "
           "the predictor stays constant (loss log 2); it learns with penalty <= 1",
    "ERMPlusPlus": "DomainBed's defaults train the linear head only, at linear_lr 5e-5, for the first 501 updates; "
                   "tests/test_algorithms_ermpp.py shows it learning with a short warm-up",
    "ERMPlusPlus+ModReg": "as ERMPlusPlus",
    "CLIP": "a linear probe: the head alone trains over the frozen random MLP, 0.71 -> 0.62 in 40 updates at lr 1e-3; "
            "tests/test_clip.py shows it learning",
}


# Updates the check gives methods that train the network in only some of their updates:
# ADRMX (its default d_steps_per_g_step = 2: one update in three moves the 9-layer network) with
# ModReg's masks reaches the check's bound after about 80 updates (0.693 -> 0.656 after 40).
SLOW_LEARNERS = {"ADRMX+ModReg": 120}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=LOSS_STAYS[n])) if n in LOSS_STAYS else n
    for n in ALL_ALGORITHMS
])
def test_loss_falls_on_separable_problem(name):
    # the update rule is under test, not the featurizer (every featurizer runs in the build test)
    check_loss_falls(name, steps=SLOW_LEARNERS.get(name, 40))


@pytest.mark.parametrize("name", ALL_ALGORITHMS)
def test_equal_seeds_give_equal_results(name):
    check_equal_seeds(name)


@pytest.mark.parametrize("name", ALL_ALGORITHMS)
def test_checkpoint_state_round_trip_continues_identically(name):
    check_checkpoint_round_trip(name)
