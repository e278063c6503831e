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
