"""Every spec shipped in sweeps/ loads and expands to jobs, so a typo in one is caught before a user launches it."""

from __future__ import annotations

from pathlib import Path

import pytest

from domaingen.sweep.spec import build_jobs, load_spec

SPECS = sorted((Path(__file__).resolve().parents[1] / "sweeps").glob("*.toml"))


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_each_shipped_spec_builds_its_jobs(path):
    jobs = build_jobs(load_spec(path))
    assert jobs and len({job.job_id for job in jobs}) == len(jobs)


def test_dmg_rmnist_parts_hold_its_networks_and_in_domain_test():
    jobs = build_jobs(load_spec(SPECS[0].parent / "dmg_rmnist.toml"))
    assert {job.args["algorithm"] for job in jobs} == {"ERM", "MultiHead", "DMG"}
    by_network = {}
    for job in jobs:
        by_network.setdefault(job.args["hparams"]["featurizer"], set()).add(job.args["steps"])
        assert job.args["in_domain_test"] == 0.1 and job.args["test_envs"] == [0]
    assert by_network == {"MNIST_CNN": {2001}, "MLP": {3001}}
    # parts 1-2: three algorithms x three trials each; part 3: DMG alone with the paper's preset
    paper = [job for job in jobs if job.args["hparams"].get("dmg_preset") == "paper"]
    assert {job.args["algorithm"] for job in paper} == {"DMG"} and len(paper) == 3
    assert len(jobs) == 2 * 3 * 3 + 3


@pytest.mark.parametrize("name, key", [("dmg_lambda_rmnist.toml", "dmg_lambda_o"), ("dmg_sparsity_rmnist.toml", "dmg_lambda_s")])
def test_dmg_sensitivity_specs_hold_one_mlp_part_per_grid_value(name, key):
    """DMG's lambda_O (Fig. 4) and lambda_S (Fig. 6) sweeps: dmg_rmnist.toml part 2's protocol, three
    trials at hparams_seed 0 for each of 0, 1e-5, ..., 1."""
    jobs = build_jobs(load_spec(SPECS[0].parent / name))
    grid = [0.0] + [10.0**e for e in range(-5, 1)]
    assert len(jobs) == 3 * len(grid)
    by_value = {}
    for job in jobs:
        args = job.args
        assert args["algorithm"] == "DMG" and args["dataset"] == "RotatedMNIST" and args["test_envs"] == [0]
        assert args["in_domain_test"] == 0.1 and args["steps"] == 3001 and args["hparams_seed"] == 0
        assert set(args["hparams"]) == {"featurizer", key} and args["hparams"]["featurizer"] == "MLP"
        by_value.setdefault(args["hparams"][key], set()).add(args["trial_seed"])
    assert sorted(by_value) == pytest.approx(grid) and all(seeds == {0, 1, 2} for seeds in by_value.values())
