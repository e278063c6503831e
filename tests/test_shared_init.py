"""shared_init: every hparams draw of a trial starts from the trial's linear probe (DiWA's recipe)."""

from __future__ import annotations

import pytest
import torch

from conftest import FAST_HPARAMS
from domaingen.algorithms import ALGORITHMS
from domaingen.datasets import DATASETS
from domaingen.errors import DomaingenError
from domaingen.run.protocol import seed_as_domainbed
from domaingen.run.rundir import RunDirectory
from domaingen.run.shared_init import PROBE_DIR, state_id
from domaingen.run.training import TrainConfig, resolve, train
from domaingen.sweep.spec import build_jobs, parse_spec

# mlp_depth is drawn: fixed, so that every draw has the probe's architecture
FAST = {**FAST_HPARAMS, "mlp_depth": 3}


def config(root, hparams_seed: int, hparams=None, **extra) -> TrainConfig:
    return TrainConfig(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(root / f"draw{hparams_seed}"),
                       test_envs=[0], data_dir="embedded", hparams=hparams or FAST, hparams_seed=hparams_seed,
                       steps=3, checkpoint_freq=2, shared_init="linear_probe", **extra)


def test_every_draw_of_a_trial_starts_from_its_one_linear_probe(tmp_path):
    for hparams_seed in (1, 2):
        train(config(tmp_path, hparams_seed))
    probes = list((tmp_path / PROBE_DIR).iterdir())
    assert len(probes) == 1  # made by the first draw, found done by the second
    probe = RunDirectory(probes[0])
    args = probe.read_args()
    assert (args["linear_probe"], args["hparams_seed"], args["shared_init"]) == (True, 0, None)
    weights = probe.load_checkpoint()["algorithm"]["model"]
    recorded = {r["shared_init_id"] for h in (1, 2) for r in RunDirectory(tmp_path / f"draw{h}").records()}
    assert recorded == {state_id(weights)}
    # the probe trained the classifier alone: its featurizer is the one its seed built, where DomainBed draws it
    assert args["protocol"] == "domainbed"
    dataset = DATASETS.get("ColoredMNIST")
    seed_as_domainbed(args["seed"], dataset.built_as_domainbed(args["seed"])("embedded", [0], {}), 3, 1)
    fresh = ALGORITHMS.get("ERM")(dataset.INPUT_SHAPE, dataset.NUM_CLASSES, 2, probe.records()[0]["hparams"])
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, weights[name]) == name.startswith(("featurizer.", "network.0.")), name


def test_a_draw_starts_from_the_probe_not_from_its_own_seed(tmp_path):
    # at lr 0 nothing moves: the draw ends where it started, on the probe's weights (the probe at lr 0 too)
    train(config(tmp_path, 1, {**FAST, "lr": 0.0}))
    probe = RunDirectory(next((tmp_path / PROBE_DIR).iterdir())).load_checkpoint()["algorithm"]["model"]
    draw = RunDirectory(tmp_path / "draw1").load_checkpoint()["algorithm"]["model"]
    assert state_id(draw) == state_id(probe)
    assert resolve(config(tmp_path, 1)).settings.seed != resolve(config(tmp_path, 0)).settings.seed


def test_without_shared_init_records_and_job_ids_are_unchanged(tmp_path):
    run = train(TrainConfig(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(tmp_path / "r"), test_envs=[0],
                            data_dir="embedded", hparams=FAST, steps=1))
    assert all("shared_init_id" not in r for r in run.records)
    assert not (tmp_path / PROBE_DIR).exists()
    spec = {"algorithms": ["ERM"], "datasets": ["ColoredMNIST"], "n_hparams": 1, "n_trials": 1, "steps": 2}
    plain, shared = build_jobs(parse_spec(spec))[0], build_jobs(parse_spec({**spec, "shared_init": "linear_probe"}))[0]
    assert "shared_init" not in plain.args and shared.args["shared_init"] == "linear_probe"
    assert plain.job_id != shared.job_id


def test_linear_probe_with_shared_init_is_refused(tmp_path):
    with pytest.raises(DomaingenError, match="^linear_probe is the step shared_init runs first; give one of them"):
        resolve(config(tmp_path, 1, linear_probe=True))


def test_a_draw_of_another_architecture_is_refused(tmp_path):
    hparams = {"featurizer": "MLP", "mlp_width": 8}  # the paired protocol draws mlp_depth (DomainBed's does not)
    other = next(h for h in range(1, 20)
                 if resolve(config(tmp_path, h, hparams, protocol="paired")).hparams["mlp_depth"] != 3)
    with pytest.raises(DomaingenError, match=f"^the shared initialisation does not fit hparams draw {other} of ERM "
                                             r"\(.*\); shared_init needs draws of one architecture"):
        train(config(tmp_path, other, hparams, protocol="paired"))
