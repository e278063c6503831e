"""The ModReg grid specs (sweeps/modreg_grid_*.toml): the grid's points, the pairing with the base, the rescaling."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from domaingen.run.training import run_seed
from domaingen.sweep.spec import build_jobs, load_spec

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"
SCALES = {0.01, 0.03, 0.1, 0.3, 1.0}
MASK_LRS = {1e-4, 1e-3, 1e-2}


def _jobs(name: str) -> list:
    return build_jobs(load_spec(SWEEPS / name))


def _points(jobs, algorithm: str, **fixed) -> dict[tuple[float, float], set[int]]:
    """(modreg_scale, modreg_mask_lr) -> trial seeds, over the jobs of `algorithm` whose hparams include `fixed`."""
    points: dict[tuple[float, float], set[int]] = {}
    for job in jobs:
        hp = job.args["hparams"]
        if job.args["algorithm"] == algorithm and all(hp.get(k) == v for k, v in fixed.items()):
            points.setdefault((hp["modreg_scale"], hp["modreg_mask_lr"]), set()).add(job.args["trial_seed"])
    return points


@pytest.mark.parametrize("name, bases, trials, n_jobs", [
    # IRM+ModReg rescaled and not, and pi's second reading at two points (parts 48 and 49)
    ("modreg_grid_irm.toml", ["ERM", "IRM"], 10, (2 + 15 + 2 * 15 + 2) * 10),
    ("modreg_grid_rmnist.toml", ["ERM"], 3, (1 + 15) * 3),
    ("modreg_grid_rmnist_irm.toml", ["IRM"], 3, (1 + 15) * 3),  # DomainBed's IRM: nothing to rescale
])
def test_grid_spec_covers_every_point_paired_with_its_base(name, bases, trials, n_jobs):
    jobs = _jobs(name)
    grid = set(itertools.product(SCALES, MASK_LRS))
    rescaling = name == "modreg_grid_irm.toml"
    for base in bases:
        fixed = {"modreg_rescaled": True} if base == "IRM" and rescaling else {}
        assert _points(jobs, f"{base}+ModReg", **fixed) == {p: set(range(trials)) for p in grid}
        runs = [j.args for j in jobs if j.args["algorithm"] in (base, f"{base}+ModReg")]
        # X and X+ModReg of trial t: the same training seed, every other hyperparameter X's own
        assert {run_seed(a["dataset"], a["algorithm"], a["test_envs"], a["hparams_seed"], a["trial_seed"])
                for a in runs if a["trial_seed"] == 0} == {
            run_seed(runs[0]["dataset"], base, runs[0]["test_envs"], 0, 0)}
        base_hp = next(a["hparams"] for a in runs if a["algorithm"] == base)
        for a in runs:
            assert {k: v for k, v in a["hparams"].items() if not k.startswith("modreg_")} == base_hp
            assert a["hparams"].get("modreg_alpha", 6.93e-9) == 6.93e-9
            assert a["hparams"].get("modreg_beta", 1.12e-4) == 1.12e-4
    if rescaling:
        assert _points(jobs, "IRM+ModReg", modreg_rescaled=False) == {p: set(range(trials)) for p in grid}
    assert len(jobs) == n_jobs


def test_irm_grid_is_the_irm_papers_protocol():
    for job in _jobs("modreg_grid_irm.toml"):
        a = job.args
        assert (a["dataset"], a["test_envs"], a["steps"], a["holdout_fraction"]) == ("IRMColoredMNIST", [2], 501, 0.0)
        if a["algorithm"].startswith("IRM"):
            assert a["hparams"]["penalty_schedule"] == "irm_paper" and a["hparams"]["irm_lambda"] == pytest.approx(91257.186)


@pytest.mark.parametrize("name", ["modreg_grid_rmnist.toml", "modreg_grid_rmnist_irm.toml"])
def test_rmnist_grid_runs_domainbeds_mlp_at_full_length(name):
    for job in _jobs(name):
        a = job.args
        assert (a["dataset"], a["test_envs"], a["steps"], a["hparams"]["featurizer"]) == ("RotatedMNIST", [0], 5001, "MLP")


def test_pi_and_trials_specs_extend_the_grid_at_its_points():
    """The pi-reading spec is one grid point with modreg_pi = "logit", its trial t paired with the grid's
    ERM of trial t (the grid's for trials 0-2, the trials spec's after); the trials spec's first three
    trials are the grid's own jobs (the same ids), so launched into the grid's directory only the new
    trials run."""
    grid = _jobs("modreg_grid_rmnist.toml")
    grid_ids = {j.job_id for j in grid}
    trials = _jobs("modreg_grid_rmnist_trials.toml")
    pi = _jobs("modreg_pi_rmnist.toml")
    assert {j.args["hparams"]["modreg_pi"] for j in pi} == {"logit"} and len(pi) == 24
    point = {k: v for k, v in pi[0].args["hparams"].items() if k != "modreg_pi"}
    twins = [j for j in grid if j.args["hparams"] == point]
    assert len(twins) == 3 and not {j.job_id for j in pi} & grid_ids
    for job in pi:
        a = job.args
        erm = next(j.args for j in grid + trials
                   if j.args["algorithm"] == "ERM" and j.args["trial_seed"] == a["trial_seed"])
        assert run_seed(a["dataset"], a["algorithm"], a["test_envs"], a["hparams_seed"], a["trial_seed"]) == \
            run_seed(erm["dataset"], "ERM", erm["test_envs"], 0, a["trial_seed"])
        assert {k: v for k, v in a.items() if k not in ("algorithm", "hparams")} == \
            {k: v for k, v in erm.items() if k not in ("algorithm", "hparams")}
    early = {j.job_id for j in trials if j.args["trial_seed"] < 3}
    assert len(trials) == 3 * 24 and early <= grid_ids and len(early) == 9
    assert not {j.job_id for j in trials if j.args["trial_seed"] >= 3} & grid_ids


@pytest.mark.parametrize("point", [(0.03, 0.01, False), (0.3, 0.01, True)], ids=["part48", "part49"])
def test_irm_grid_reads_pi_as_the_logit_at_its_best_points_paired_by_restart(point):
    """Parts 48 and 49 are parts 44 (scale 0.03, mask lr 1e-2, not rescaled) and 31 (scale 0.3, mask lr 1e-2,
    rescaled) with modreg_pi = "logit" and nothing else changed: restart t shares the training seed and every
    argument with IRM's restart t and with its point's."""
    jobs = _jobs("modreg_grid_irm.toml")
    logit = [j.args for j in jobs if j.args["hparams"].get("modreg_pi") == "logit" and (
        j.args["hparams"]["modreg_scale"], j.args["hparams"]["modreg_mask_lr"],
        j.args["hparams"]["modreg_rescaled"]) == point]
    assert len(logit) == 10 and {a["trial_seed"] for a in logit} == set(range(10))
    sigmoid_twin = {k: v for k, v in logit[0]["hparams"].items() if k != "modreg_pi"}
    for a in logit:
        twins = [j.args for j in jobs if j.args["trial_seed"] == a["trial_seed"] and (
            j.args["algorithm"] == "IRM" or j.args["hparams"] == sigmoid_twin)]
        assert len(twins) == 2
        for twin in twins:
            assert run_seed(a["dataset"], a["algorithm"], a["test_envs"], a["hparams_seed"], a["trial_seed"]) == \
                run_seed(twin["dataset"], "IRM", twin["test_envs"], 0, a["trial_seed"])
            assert {k: v for k, v in a.items() if k not in ("algorithm", "hparams")} == \
                {k: v for k, v in twin.items() if k not in ("algorithm", "hparams")}


def test_irm_trials_spec_extends_the_rmnist_irm_grid():
    """IRM and all fifteen grid points to twelve trials: the first three trials are the grid's own jobs
    (launched into its directory only trials 3-11 run), and every IRM+ModReg run of trial t shares IRM's
    training seed and arguments."""
    grid = _jobs("modreg_grid_rmnist_irm.toml")
    grid_ids = {j.job_id for j in grid}
    trials = _jobs("modreg_grid_rmnist_irm_trials.toml")
    grid_points = set(_points(grid, "IRM+ModReg"))
    assert len(grid_points) == 15
    assert _points(trials, "IRM+ModReg") == {point: set(range(12)) for point in grid_points}
    early = {j.job_id for j in trials if j.args["trial_seed"] < 3}
    assert len(trials) == 16 * 12 and early == grid_ids
    assert not {j.job_id for j in trials if j.args["trial_seed"] >= 3} & grid_ids
    irm = {j.args["trial_seed"]: j.args for j in trials if j.args["algorithm"] == "IRM"}
    for job in trials:
        a, base = job.args, irm[job.args["trial_seed"]]
        assert run_seed(a["dataset"], a["algorithm"], a["test_envs"], a["hparams_seed"], a["trial_seed"]) == \
            run_seed(base["dataset"], "IRM", base["test_envs"], 0, a["trial_seed"])
        assert {k: v for k, v in a.items() if k not in ("algorithm", "hparams")} == \
            {k: v for k, v in base.items() if k not in ("algorithm", "hparams")}


def test_cnn_spec_pairs_each_base_with_the_defaults_and_its_grids_best_point():
    """sweeps/modreg_cnn.toml: DomainBed's MNIST_CNN at full length, each base beside ModReg at the defaults
    (scale 0.1, mask lr 1e-3) and at the best other point of the MLP grid on its dataset, trials 0-2 paired."""
    jobs = _jobs("modreg_cnn.toml")
    best = {("ColoredMNIST", "ERM"): (0.3, 1e-4), ("ColoredMNIST", "IRM"): (0.3, 1e-4),
            ("RotatedMNIST", "ERM"): (0.3, 1e-3), ("RotatedMNIST", "IRM"): (0.03, 1e-2)}
    for (dataset, base), point in best.items():
        runs = [j.args for j in jobs if j.args["dataset"] == dataset and j.args["algorithm"] in (base, f"{base}+ModReg")]
        assert _points([j for j in jobs if j.args["dataset"] == dataset], f"{base}+ModReg") == {
            (0.1, 1e-3): {0, 1, 2}, point: {0, 1, 2}}
        assert sorted(a["trial_seed"] for a in runs if a["algorithm"] == base) == [0, 1, 2]
        assert {run_seed(a["dataset"], a["algorithm"], a["test_envs"], a["hparams_seed"], a["trial_seed"])
                for a in runs if a["trial_seed"] == 1} == {run_seed(dataset, base, runs[0]["test_envs"], 0, 1)}
        for a in runs:
            assert (a["steps"], a["checkpoint_freq"], a["hparams"]["featurizer"], a["precision"]) == (
                5001, 100, "MNIST_CNN", "fp32")
            assert a["test_envs"] == ([2] if dataset == "ColoredMNIST" else [0])
            assert a["hparams"].get("modreg_alpha", 6.93e-9) == 6.93e-9
            assert a["hparams"].get("modreg_beta", 1.12e-4) == 1.12e-4
    assert len(jobs) == 36
