"""`domaingen evaluate / diagnose`: reload a run's model; bad input gives one line, exit 2, and writes nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import FAST_HPARAMS
from domaingen.cli.main import main
from domaingen.run.rundir import RunDirectory


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def make_run(tmp_path_factory, capsys_free_main, algorithm: str) -> Path:
    out = tmp_path_factory.mktemp(algorithm.replace("+", "_")) / "run"
    hparams = {**FAST_HPARAMS, "lr": 3e-3}
    code = capsys_free_main(["-q", "train", "--dataset", "ColoredMNIST", "--algorithm", algorithm, "--test_envs", "2",
                             "--data_dir", "embedded", "--steps", "7", "--checkpoint_freq", "2",
                             "--hparams", json.dumps(hparams), "--output_dir", str(out),
                             # every split at every checkpoint: `evaluate` is compared with all of them
                             "--eval_splits", "all"])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    return {name: make_run(tmp_path_factory, main, name) for name in ("ERM", "DMG")}


def table_rows(out: str) -> dict[int, dict[str, str]]:
    lines = out.splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.startswith("env "))
    headers = lines[header_at].split()
    rows = {}
    for line in lines[header_at + 2:]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        rows[int(cells[0])] = dict(zip(headers, cells))
    return rows


def expected_cell(record: dict, key: str) -> str:
    value = record.get(key)
    return "-" if value is None else f"{value:.4f}"


@pytest.mark.parametrize("algorithm", ["ERM", "DMG"])
@pytest.mark.parametrize("checkpoint", ["selected", "last"])
def test_evaluate_prints_the_record_of_the_checkpoint(runs, capsys, algorithm, checkpoint):
    run = runs[algorithm]
    rundir = RunDirectory(run)
    step = rundir.load_selected()["step"] if checkpoint == "selected" else rundir.records()[-1]["step"]
    record = next(r for r in rundir.records() if r["step"] == step)
    before = snapshot(run)
    code, out, _ = run_cli(capsys, "evaluate", str(run), "--checkpoint", checkpoint)
    assert code == 0
    assert f"{checkpoint} checkpoint (step {step})" in out
    assert f"equal to the record of step {step}" in out
    rows = table_rows(out)
    modes = ["mask_ens", "kd"] if algorithm == "DMG" else []
    for env in range(3):
        for split in ("in", "out"):
            assert rows[env][split] == expected_cell(record, f"env{env}_{split}_acc")
            for mode in modes:
                assert rows[env][f"{split}_{mode}"] == expected_cell(record, f"env{env}_{split}_acc_{mode}")
    if algorithm == "DMG":
        assert rows[2]["in_kd"] == "-" and rows[0]["in_kd"] != "-"  # known-domain is undefined on the test env
    assert snapshot(run) == before


def test_evaluate_in_another_precision_says_how_far_it_moves(runs, capsys):
    from domaingen.run.evaluation import split_accuracy
    from domaingen.run.reload import load_run, run_precision

    run = runs["ERM"]  # trained and evaluated in fp32
    loaded = load_run(run, "last")
    record = loaded.record()
    expected = {f"env{i}_{name}_acc": split_accuracy(loaded.algorithm, split, loaded.device, "bf16")
                for i, pair in enumerate(loaded.splits) for name, split in zip(("in", "out"), pair)}
    code, out, _ = run_cli(capsys, "evaluate", str(run), "--checkpoint", "last", "--precision", "bf16")
    assert code == 0
    assert "evaluated in bf16 (the run: fp32)" in out
    rows = table_rows(out)
    for key, value in expected.items():
        env, split = int(key[3]), key.split("_")[1]
        assert rows[env][split] == f"{value:.4f}"
    worst = max(expected, key=lambda k: abs(expected[k] - record[k]))
    gap = abs(expected[worst] - record[worst])
    last = out.strip().splitlines()[-1]
    assert last == (f"equal to the record of step {record['step']} (6 accuracies)" if gap == 0 else
                    f"differs from the record of step {record['step']} by up to {gap:.2g} ({worst})")
    # a run that asked for auto evaluates as it resolved where it started
    loaded.args.update(precision="auto", resolved_precision="bf16")
    assert run_precision(loaded) == "bf16"
    loaded.args.pop("resolved_precision")  # a run from before runs recorded it: this machine's auto
    from domaingen.run.precision import auto_precision, read_cpu_flags
    assert loaded.device.type != "cpu" or run_precision(loaded) == auto_precision("cpu", read_cpu_flags())


def test_a_run_without_selected_checkpoint_offers_last(runs, tmp_path, capsys):
    old = tmp_path / "old"
    shutil.copytree(runs["ERM"], old)
    (old / "selected.pt").unlink()
    before = snapshot(old)
    for command in ("evaluate", "diagnose"):
        code, out, err = run_cli(capsys, command, str(old))
        assert code == 2 and out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err
        assert lines[0] == (f"domaingen: error: {old} has no selected checkpoint (selected.pt): the run was made before "
                            "runs kept one, or has no validation split; use --checkpoint last for its last checkpoint")
    assert snapshot(old) == before


def test_missing_data_gives_trains_data_error(runs, tmp_path, capsys):
    run = runs["ERM"]
    before = snapshot(run)
    for command in ("evaluate", "diagnose"):
        code, _, err = run_cli(capsys, command, str(run), "--data_dir", str(tmp_path / "empty"))
        assert code == 2
        assert len(err.strip().splitlines()) == 1
        assert f"MNIST not found in {tmp_path / 'empty' / 'MNIST' / 'raw'}" in err
        assert "train-images-idx3-ubyte" in err and "--data_dir embedded" in err
    assert snapshot(run) == before


def test_a_sweep_directory_is_not_a_run(tmp_path, capsys):
    code, _, err = run_cli(capsys, "evaluate", str(tmp_path))
    assert code == 2
    assert err.strip() == f"domaingen: error: {tmp_path} is not a run directory (no args.json); give one run of a sweep, not the sweep"


def manual_hidden_activations(model, x):
    """The MLP's ReLU outputs computed by hand from its weights (no hooks)."""
    linear = model.featurizer.layers[1]
    return torch.relu(x.flatten(1) @ linear.weight.t() + linear.bias)


def test_diagnose_writes_selectivity_equal_to_a_hand_forward(runs, tmp_path, capsys):
    from domaingen.inspect.neurons import class_means, selectivity
    from domaingen.run.reload import load_run

    run = shutil.copytree(runs["ERM"], tmp_path / "erm")
    code, out, _ = run_cli(capsys, "diagnose", str(run), "--max_examples", "300")
    assert code == 0 and f"wrote {run / 'diagnostics.json'}" in out
    result = json.loads((run / "diagnostics.json").read_text())
    assert result["step"] == RunDirectory(run).load_selected()["step"] and result["sections"] == {}
    assert [e["split"] for e in result["environments"]] == ["out", "out", "in"]
    loaded = load_run(run)
    layer = result["layers"]["featurizer.layers.3"]
    for env in range(3):
        split_in, split_out = loaded.splits[env]
        split = split_in if env == 2 else split_out
        x, y = split.batch(slice(0, 300))
        with torch.no_grad():
            acts = manual_hidden_activations(loaded.algorithm, x)
        expected = selectivity(class_means(acts, y, 2)).numpy()
        assert np.allclose(layer["per_env"][f"env{env}"]["selectivity_per_neuron"], expected, atol=1e-5)
        rates = (acts > 0).double()
        per_class = [float(rates[y == c].mean()) for c in (0, 1)]
        assert layer["per_env"][f"env{env}"]["activation_rate_per_class"] == pytest.approx(per_class)
    assert layer["test"]["selectivity_per_neuron"] == layer["per_env"]["env2"]["selectivity_per_neuron"]


def test_diagnose_dmg_has_its_mask_section_and_domain_masks(runs, tmp_path, capsys):
    run = runs["DMG"]
    before = snapshot(run)
    output = tmp_path / "diag.json"
    code, out, _ = run_cli(capsys, "diagnose", str(run), "--max_examples", "100", "--domain_masks",
                           "--mask_steps", "3", "--output", str(output))
    assert code == 0 and "dmg_masks" in out and "domain_masks" in out
    assert snapshot(run) == before  # --output elsewhere: the run directory is untouched
    result = json.loads(output.read_text())
    masks = result["sections"]["dmg_masks"]
    assert set(masks) == {"featurizer.layers.4", "featurizer.layers.7", "classifier"}
    assert np.array(masks["classifier"]["mask"]).shape == (2, 32)
    domain = result["domain_masks"]
    assert domain["steps"] == 3 and [a["domain"] for a in domain["accuracy"]] == ["+90%", "+80%"]
    for layer in domain["layers"].values():
        iou = np.array(layer["iou"], dtype=float)
        assert iou.shape == (2, 2) and (np.isnan(iou.diagonal()) | (iou.diagonal() == 1)).all()


@pytest.mark.parametrize("flag, message", [("--max_examples", "--max_examples must be positive, got 0"),
                                           ("--mask_steps", "--mask_steps must be positive, got 0")])
def test_non_positive_diagnose_counts_are_refused(runs, capsys, flag, message):
    run = runs["ERM"]
    before = snapshot(run)
    extra = ["--domain_masks"] if flag == "--mask_steps" else []
    code, _, err = run_cli(capsys, "diagnose", str(run), flag, "0", *extra)
    assert code == 2 and err.strip() == f"domaingen: error: {message}"
    assert snapshot(run) == before
