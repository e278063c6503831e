"""`evaluate --masks_x_domains`: every training domain's mask (or head) on every environment, DMG's Table 4."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import FAST_HPARAMS
from domaingen.cli.main import main
from domaingen.run.reload import load_run


def make_run(root: Path, algorithm: str, *extra: str) -> Path:
    out = root / algorithm / "run"
    code = main(["-q", "train", "--dataset", "ColoredMNIST", "--algorithm", algorithm, "--test_envs", "2",
                 "--data_dir", "embedded", "--steps", "3", "--checkpoint_freq", "3",
                 "--hparams", json.dumps(FAST_HPARAMS), "--output_dir", str(out), *extra])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mxd")
    return {"DMG": make_run(root, "DMG", "--in_domain_test", "0.1"), "MultiHead": make_run(root, "MultiHead"),
            "ERM": make_run(root, "ERM")}


def hand_accuracy(algorithm, split, **kwargs) -> float:
    x, y = split.batch(slice(None))
    with torch.no_grad():
        return float((algorithm.predict(x, **kwargs).argmax(1) == y).float().mean())


@pytest.mark.parametrize("name", ["DMG", "MultiHead"])
def test_matrix_equals_a_loop_over_masks_and_environments(runs, capsys, name):
    assert main(["-q", "evaluate", str(runs[name]), "--masks_x_domains"]) == 0
    out = capsys.readouterr().out
    matrix = json.loads((runs[name] / "diagnostics.json").read_text())["masks_x_domains"]
    loaded = load_run(runs[name])
    assert matrix["columns"] == ["+90%", "+80%", "-90%"]
    expected_rows = ["+90%", "+80%", "Pred-Ens"] + (["Mask-Ens"] if name == "DMG" else [])
    assert matrix["rows"] == expected_rows and matrix["train_rows"] == 2
    # held-out env: its in split; training envs: the in-domain test split where the run has one, else out
    train_split = "idtest" if name == "DMG" else "out"
    assert matrix["splits"] == [train_split, train_split, "in"]
    splits = [loaded.idtest[0] if name == "DMG" else loaded.splits[0][1],
              loaded.idtest[1] if name == "DMG" else loaded.splits[1][1], loaded.splits[2][0]]
    for d in range(2):
        assert matrix["accuracy"][d] == [pytest.approx(hand_accuracy(loaded.algorithm, s, domain=d)) for s in splits]
    assert matrix["accuracy"][2] == [pytest.approx(hand_accuracy(loaded.algorithm, s)) for s in splits]
    if name == "DMG":
        assert matrix["accuracy"][3] == [pytest.approx(hand_accuracy(loaded.algorithm, s, mode="mask_ens"))
                                         for s in splits]
    assert "Pred-Ens" in out and "-90% (in, test)" in out
    unit = "head" if name == "MultiHead" else "mask"
    assert f"each training domain's {unit} (known-domain prediction; rows)" in out and " kd " not in out
    assert out.split("known-domain prediction; rows)")[1].split("\n")[2].split()[0] == unit  # the table's header


def test_diagnose_keeps_the_matrix(runs, capsys):
    main(["-q", "evaluate", str(runs["MultiHead"]), "--masks_x_domains"])
    main(["-q", "diagnose", str(runs["MultiHead"]), "--max_examples", "50"])
    capsys.readouterr()
    diagnostics = json.loads((runs["MultiHead"] / "diagnostics.json").read_text())
    assert "masks_x_domains" in diagnostics and "layers" in diagnostics


def test_an_algorithm_without_domain_aware_prediction_is_one_line_exit_2_and_writes_nothing(runs, capsys):
    before = sorted(p.name for p in runs["ERM"].iterdir())
    code = main(["-q", "evaluate", str(runs["ERM"]), "--masks_x_domains"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip().count("\n") == 0
    assert "needs an algorithm whose prediction takes a domain (DMG, MultiHead); ERM has none" in captured.err
    assert sorted(p.name for p in runs["ERM"].iterdir()) == before


@pytest.mark.parametrize("name", ["DMG", "MultiHead"])
def test_report_draws_the_matrix_as_a_heatmap(runs, tmp_path, capsys, name):
    pytest.importorskip("matplotlib")
    from domaingen.inspect.report import build_report

    main(["-q", "evaluate", str(runs[name]), "--masks_x_domains"])
    capsys.readouterr()
    report = build_report(runs[name].parent, tmp_path / "out", keep_figures=True)
    figure = next(f for f in report.figures if f.name.endswith("_masks_x_domains.png"))
    matrix = json.loads((runs[name] / "diagnostics.json").read_text())["masks_x_domains"]
    ax, colorbar = figure.figure.axes
    image = ax.get_images()[0]
    assert np.allclose(image.get_array(), 100 * np.array(matrix["accuracy"]))
    assert image.get_clim() == (0, 100) and colorbar.get_ylabel() == "accuracy (%)"  # one scale for every algorithm
    texts = [t.get_text() for t in ax.texts]
    assert texts == [f"{100 * v:.1f}" for row in matrix["accuracy"] for v in row]
    unit = "head" if name == "MultiHead" else "mask"
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"{unit} +90%", f"{unit} +80%", "Pred-Ens"] + (
        ["Mask-Ens"] if name == "DMG" else [])
    assert ax.get_ylabel() == f"{unit} applied" and f"domain's {unit} on every environment" in ax.get_title()
    assert "kd" not in figure.caption and "known-domain" in figure.caption
    assert ("Mask-Ens" in figure.caption) == (name == "DMG")
    # the held-out environment (column 2) is set apart by a white vertical line as well as its *
    assert [t.get_text() for t in ax.get_xticklabels()][2] == "-90%*\n(in)"
    assert [list(line.get_xdata()) for line in ax.get_lines() if line.get_xdata()[0] == line.get_xdata()[1]] == [[1.5, 1.5]]


def test_heatmap_shows_a_missing_cell_and_page_sized_text():
    pytest.importorskip("matplotlib")
    from domaingen.inspect.report import DPI, _pyplot, masks_x_domains_heatmap

    matrix = {"rows": ["a", "b", "Pred-Ens"], "columns": ["a", "b", "c"], "splits": ["out", "out", "in"],
              "test_envs": [0], "train_rows": 2, "accuracy": [[0.5, float("nan"), 0.25], [0.9, 0.8, 0.7], [0.6, 0.6, 0.6]]}
    spec = masks_x_domains_heatmap("r", "run", matrix, _pyplot())
    ax = spec.figure.axes[0]
    image = ax.get_images()[0]
    assert image.get_array().mask[0, 1] and image.cmap.get_bad()[:3] == pytest.approx((0.85, 0.85, 0.85))
    assert ax.texts[1].get_text() == "–" and ax.texts[1].get_color() == "black"
    assert 1000 <= spec.figure.get_figwidth() * DPI <= 1100
    assert min(t.get_fontsize() for t in ax.texts + ax.get_xticklabels() + ax.get_yticklabels()) >= 9
    assert "validation split, which model selection reads" in spec.caption


@pytest.fixture(scope="module")
def dmg_sweep(tmp_path_factory) -> Path:
    """Three DMG trials and one ERM run in one sweep directory; trials 0 and 1 evaluated with --masks_x_domains."""
    sweep = tmp_path_factory.mktemp("mxd_sweep")
    for name, algorithm, trial in (("dmg0", "DMG", 0), ("dmg1", "DMG", 1), ("dmg2", "DMG", 2), ("erm0", "ERM", 0)):
        code = main(["-q", "train", "--dataset", "ColoredMNIST", "--algorithm", algorithm, "--test_envs", "2",
                     "--data_dir", "embedded", "--steps", "3", "--checkpoint_freq", "3", "--trial_seed", str(trial),
                     "--hparams", json.dumps(FAST_HPARAMS), "--output_dir", str(sweep / name),
                     "--protocol", "paired"])  # DMG's protocol (DomainBed has no DMG), for ERM too: one table
        assert code == 0
    for name in ("dmg0", "dmg1"):
        assert main(["-q", "evaluate", str(sweep / name), "--masks_x_domains"]) == 0
    return sweep


def test_collect_averages_the_selected_runs_matrices_over_trials(dmg_sweep, capsys):
    import pandas as pd

    capsys.readouterr()
    matrices = [np.array(json.loads((dmg_sweep / name / "diagnostics.json").read_text())["masks_x_domains"]["accuracy"])
                for name in ("dmg0", "dmg1")]
    assert main(["-q", "collect", "masks-x-domains", "--input_dir", str(dmg_sweep), "--format", "csv"]) == 0
    table = pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))
    assert set(table["algorithm"]) == {"DMG"}  # ERM has no matrix and no domain-taking prediction: no table
    assert list(table["applied"].unique()) == ["mask +90%", "mask +80%", "Pred-Ens", "Mask-Ens"]
    assert list(table["environment"].unique()) == ["+90% (out)", "+80% (out)", "-90% (in, held out)"]
    for k, row in table.iterrows():
        i, j = divmod(k, 3)
        a, b = matrices[0][i, j], matrices[1][i, j]
        assert row["mean"] == pytest.approx(100 * (a + b) / 2)
        # DomainBed's error bar written out for two trials: |a - b| / 2 / sqrt(2)
        assert row["error"] == pytest.approx(100 * abs(a - b) / 2 / np.sqrt(2))
        assert row["n"] == 2


def test_collect_names_the_selected_runs_it_left_out_and_why(dmg_sweep, capsys):
    diagnostics = dmg_sweep / "dmg2" / "diagnostics.json"
    assert main(["-q", "evaluate", str(dmg_sweep / "dmg2"), "--masks_x_domains"]) == 0
    stored = json.loads(diagnostics.read_text())
    selected_step = stored["masks_x_domains"]["step"]  # evaluate's default: the checkpoint selection chose
    steps = [json.loads((dmg_sweep / n / "diagnostics.json").read_text())["masks_x_domains"]["step"]
             for n in ("dmg0", "dmg1")]
    stored["masks_x_domains"]["step"] = 999  # a matrix of another checkpoint than the one selection chose
    diagnostics.write_text(json.dumps(stored))
    try:
        capsys.readouterr()
        assert main(["-q", "collect", "masks-x-domains", "--input_dir", str(dmg_sweep)]) == 0
        out = capsys.readouterr().out
    finally:
        diagnostics.unlink()
    assert "### ColoredMNIST, DMG, test env 2: every mask on every environment" in out
    assert f"Mean over trials [0, 1] (selected steps {steps[0]}, {steps[1]})" in out
    assert f"dmg2 (trial 2: matrix of step 999, selection chose step {selected_step})" in out
    assert "ERM" not in out


def test_collect_masks_x_domains_refuses_latex_and_a_sweep_without_matrices(dmg_sweep, tmp_path, capsys):
    assert main(["-q", "collect", "masks-x-domains", "--input_dir", str(dmg_sweep), "--format", "latex"]) == 2
    assert "argument --format: invalid choice: 'latex' (choose from" in capsys.readouterr().err
    bare = tmp_path / "bare"
    bare.mkdir()
    import shutil

    shutil.copytree(dmg_sweep / "dmg2", bare / "dmg2", ignore=shutil.ignore_patterns("diagnostics.json"))
    code = main(["-q", "collect", "masks-x-domains", "--input_dir", str(bare), "--output", str(tmp_path / "o.md")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0 and not (tmp_path / "o.md").exists()
    assert "no selected run here has a mask-by-domain matrix: run `domaingen evaluate RUN --masks_x_domains`" in err


def test_report_draws_the_mean_matrix_over_trials(dmg_sweep, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from domaingen.inspect.report import build_report

    (dmg_sweep / "dmg2" / "diagnostics.json").unlink(missing_ok=True)  # trial 2 has no matrix: named, not averaged
    matrices = [np.array(json.loads((dmg_sweep / name / "diagnostics.json").read_text())["masks_x_domains"]["accuracy"])
                for name in ("dmg0", "dmg1")]
    report = build_report(dmg_sweep, tmp_path / "out", keep_figures=True)
    figure = next(f for f in report.figures if f.name == "mean_ColoredMNIST_DMG_2_masks_x_domains.png")
    image = figure.figure.axes[0].get_images()[0]
    assert np.allclose(image.get_array(), 100 * (matrices[0] + matrices[1]) / 2)
    assert "mean over trials [0, 1] of the runs training-domain validation selects" in figure.caption
    assert "left out: dmg2 (trial 2: no matrix)" in figure.caption
    assert "mean over trials (training-domain validation)" in report.page.read_text()


def test_collect_reads_the_matrices_from_a_records_bundle_as_from_the_sweep(dmg_sweep, tmp_path, capsys):
    bundle = tmp_path / "records.zip"
    assert main(["-q", "export", "--input_dir", str(dmg_sweep), "--output", str(bundle), "--no_weights",
                 "--all_runs"]) == 0
    capsys.readouterr()
    assert main(["-q", "collect", "masks-x-domains", "--input_dir", str(dmg_sweep), "--format", "csv"]) == 0
    from_sweep = capsys.readouterr().out
    assert main(["-q", "collect", "masks-x-domains", "--input_dir", str(bundle), "--format", "csv"]) == 0
    assert capsys.readouterr().out == from_sweep
