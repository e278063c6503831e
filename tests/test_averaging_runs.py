"""`domaingen average`: DiWA (uniform, greedy), the uniform soup and ENS over a sweep's runs, read by collect."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import FAST_HPARAMS
from domaingen.cli.main import main
from domaingen.inspect.combine import average_sweep
from domaingen.inspect.combiners import COMBINERS, average_states, greedy, register_combiner
from domaingen.run.reload import evaluate_run, load_run, read_weights
from domaingen.run.rundir import RunDirectory, to_json
from domaingen.sweep.spec import build_jobs, parse_spec
from domaingen.run.training import train
from domaingen.tables.collect import COMBINED_DIR, collect

ALL = ["DiWA-uniform", "DiWA-greedy", "soup", "ENS"]
SPEC = {"algorithms": ["ERM"], "datasets": ["ColoredMNIST"], "test_envs": [0], "n_hparams": 3, "n_trials": 1,
        "steps": 4, "checkpoint_freq": 1, "hparams": {**FAST_HPARAMS, "mlp_depth": 3}}


def launch(root: Path, **extra) -> list[Path]:
    jobs = build_jobs(parse_spec({**SPEC, **extra}))
    for job in jobs:
        train(job.config(root, "embedded"))
    return [job.directory(root) for job in jobs]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, list[Path]]:
    """Three draws of one trial fine-tuned from its linear probe."""
    root = tmp_path_factory.mktemp("sweep")
    return root, launch(root, shared_init="linear_probe")


def copies(run: Path, root: Path, n: int) -> Path:
    """A sweep directory holding `n` copies of `run`."""
    for i in range(n):
        shutil.copytree(run, root / f"copy{i}")
    return root


def accuracies(mapping: dict) -> dict[str, float]:
    return {k: v for k, v in mapping.items() if k.startswith("env") and "_acc" in k and v is not None}


def combined_records(root: Path) -> dict[str, dict]:
    """Combiner -> the record of its (one) combined run under `root`."""
    found = {}
    for path in (root / COMBINED_DIR).iterdir():
        record = RunDirectory(path).records()
        assert len(record) == 1
        found[record[0]["args"]["combiner"]] = record[0]
    return found


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# ---- the combined models


def test_averaging_one_run_equals_that_run(sweep, tmp_path):
    run = sweep[1][0]
    average_sweep(copies(run, tmp_path, 1), ALL)
    records = combined_records(tmp_path)
    selected = accuracies(evaluate_run(load_run(run, "selected")))
    for combiner in ("DiWA-uniform", "DiWA-greedy", "ENS"):
        assert accuracies(records[combiner]) == selected, combiner
    # the soup of one run is its last checkpoint, which training evaluated on every split
    last = RunDirectory(run).records()[-1]
    assert accuracies(records["soup"]) == accuracies(last)
    assert records["soup"]["step"] == last["step"] == 3
    state = read_weights(RunDirectory(run), "selected")[1]
    assert all(torch.equal(v, state[k]) for k, v in average_states([state]).items())


def test_averaging_two_identical_runs_equals_one(sweep, tmp_path):
    run = sweep[1][1]
    average_sweep(copies(run, tmp_path, 2), ["DiWA-uniform", "soup"])
    records = combined_records(tmp_path)
    assert accuracies(records["DiWA-uniform"]) == accuracies(evaluate_run(load_run(run, "selected")))
    assert accuracies(records["soup"]) == accuracies(RunDirectory(run).records()[-1])
    state = read_weights(RunDirectory(run), "last")[1]
    assert all(torch.equal(v, state[k]) for k, v in average_states([state, state]).items())
    assert records["DiWA-uniform"]["combined"] == ["copy0", "copy1"]


def test_an_ensemble_of_copies_equals_one(sweep, tmp_path):
    run = sweep[1][2]
    average_sweep(copies(run, tmp_path, 3), ["ENS"])
    record = combined_records(tmp_path)["ENS"]
    assert accuracies(record) == accuracies(evaluate_run(load_run(run, "selected")))
    assert record["n_combined"] == 3


def test_uniform_diwa_averages_every_run_of_the_trial(sweep):
    root, runs = sweep
    average_sweep(root, ["DiWA-uniform"])
    record = combined_records(root)["DiWA-uniform"]
    states = [read_weights(RunDirectory(r), "selected")[1] for r in runs]
    by_hand = {k: (states[0][k] + states[1][k] + states[2][k]) / 3 for k in states[0]}
    loaded = load_run(runs[0], "selected")
    loaded.algorithm.load_state_dict(by_hand)
    assert accuracies(record) == pytest.approx(accuracies(evaluate_run(loaded)), abs=1e-3)
    assert sorted(record["combined"]) == sorted(r.name for r in runs)
    assert record["args"]["algorithm"] == "ERM (DiWA-uniform)"


def test_greedy_follows_diwas_loop_on_made_up_accuracies():
    own = {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6, "e": 0.6}
    soups = {"a": 0.50, "ab": 0.55, "abc": 0.54, "abd": 0.55, "abde": 0.52}
    calls = []

    def soup(chosen):
        calls.append("".join(chosen))
        return soups["".join(chosen)]

    # by hand: a (first), b (0.55 >= 0.50), c rejected (0.54 < 0.55), d kept (0.55, equal), e rejected
    assert greedy(list("cadeb"), own.get, soup) == ["a", "b", "d"]
    assert calls == ["a", "ab", "abc", "abd", "abde"]  # in decreasing own accuracy; equals (d, e) by given order


def test_a_plugin_adds_a_combiner(sweep, tmp_path):
    register_combiner("best-only", "the best-validating run alone")(lambda runs, own, _: [max(runs, key=own)])
    try:
        root, runs = sweep
        for run in runs:
            shutil.copytree(run, tmp_path / run.name)
        average_sweep(tmp_path, ["best-only"])
    finally:
        COMBINERS.unregister("best-only")
    record = combined_records(tmp_path)["best-only"]
    best = max(runs, key=lambda r: RunDirectory(r).load_selected()["val_acc"])
    assert record["combined"] == [best.name] and record["args"]["algorithm"] == "ERM (best-only)"


# ---- collect


def test_collect_shows_every_combiner_as_a_row_in_every_format(sweep, capsys):
    root, _ = sweep
    average_sweep(root, ALL)
    rows = collect(root).records
    combined = rows[rows["run"].str.startswith(f"{COMBINED_DIR}/")]
    assert sorted(combined["algorithm"]) == [f"ERM ({c})" for c in sorted(ALL)]
    test_acc = combined.set_index("algorithm")["env0_in_acc"]
    for fmt in ("markdown", "latex", "csv"):
        code, out, _ = cli(capsys, "collect", "--input_dir", str(root), "--format", fmt, "--selection", "training")
        assert code == 0
        for combiner in ALL:
            assert f"ERM ({combiner})" in out, (fmt, combiner)
    code, out, _ = cli(capsys, "collect", "--input_dir", str(root), "--selection", "training")
    line = next(l for l in out.splitlines() if l.startswith("| ERM (soup)"))
    assert f"{100 * test_acc['ERM (soup)']:.1f}" in line
    assert "X (ENS): each trial's runs combined by domaingen average from the checkpoints training-domain " \
        "validation chose (as this table's rule does), X (soup) from their last ones" in out
    code, out, _ = cli(capsys, "collect", "--input_dir", str(root), "--selection", "oracle")
    assert "validation chose (not this table's rule)" in out


def test_a_second_average_rewrites_nothing_unchanged(sweep, capsys):
    root, _ = sweep
    average_sweep(root, ["ENS"])
    assert [changed for _, changed in average_sweep(root, ["ENS"])] == [False]


# ---- bad input: one line, exit 2, nothing written


def refused(capsys, root: Path, *combiners: str) -> str:
    code, out, err = cli(capsys, "average", "--input_dir", str(root), *(["--combiners", *combiners] if combiners else []))
    assert code == 2 and not out
    assert not (root / COMBINED_DIR).exists()
    assert len(err.strip().splitlines()) == 1
    return err.strip()


def set_records(run: Path, **fields) -> None:
    records = [{**r, **fields} for r in RunDirectory(run).records()]
    (run / "results.jsonl").write_text("".join(to_json(r) + "\n" for r in records))


def test_runs_of_different_initialisations_are_refused(sweep, tmp_path, capsys):
    root = copies(sweep[1][0], tmp_path, 2)
    set_records(root / "copy1", shared_init_id="0123456789abcdef")
    assert refused(capsys, root) == (
        "domaingen: error: DiWA-uniform: runs copy0 and copy1 of ERM on ColoredMNIST (test env 0, trial 0) start from "
        f"different initialisations ({RunDirectory(root / 'copy0').records()[0]['shared_init_id']}, 0123456789abcdef); "
        "average only runs that share one")


def test_runs_without_a_shared_initialisation_are_refused_unless_ensembled(tmp_path, capsys):
    launch(tmp_path, n_hparams=2)
    assert refused(capsys, tmp_path).startswith("domaingen: error: DiWA-uniform: run ")
    assert refused(capsys, tmp_path, "soup").endswith(
        "of ERM on ColoredMNIST (test env 0, trial 0) did not start from a shared initialisation; average the runs "
        "of a sweep launched with shared_init = \"linear_probe\", or ask for --combiners ENS only")
    assert cli(capsys, "average", "--input_dir", str(tmp_path), "--combiners", "ENS")[0] == 0


def test_runs_of_different_architectures_are_refused(sweep, tmp_path, capsys):
    root = copies(sweep[1][0], tmp_path, 2)
    state = torch.load(root / "copy1" / "selected.pt", weights_only=False)
    name = next(k for k in state["model"] if k.endswith("weight"))
    state["model"][name] = torch.zeros(5, 5)
    torch.save(state, root / "copy1" / "selected.pt")
    shape = tuple(torch.load(root / "copy0" / "selected.pt", weights_only=False)["model"][name].shape)
    assert refused(capsys, root, "DiWA-uniform") == (
        "domaingen: error: DiWA-uniform: runs copy0 and copy1 of ERM on ColoredMNIST (test env 0, trial 0) have "
        f"different architectures ({name}: {shape} and (5, 5)); average runs of one architecture")


def test_greedy_without_validation_records_is_refused(sweep, tmp_path, capsys):
    root = copies(sweep[1][0], tmp_path, 1)
    set_records(root / "copy0", env1_out_acc=None, env2_out_acc=None)
    assert refused(capsys, root, "DiWA-greedy") == (
        "domaingen: error: DiWA-greedy adds runs in order of training-domain validation accuracy, but run copy0 of "
        "ERM on ColoredMNIST (test env 0, trial 0) has no validation record (holdout_fraction 0?); leave "
        "DiWA-greedy out of --combiners")
