"""`domaingen report`: every figure plots the records' numbers; a sweep with no finished run says so."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")

from domaingen.cli.main import main  # noqa: E402
from domaingen.inspect.report import build_report  # noqa: E402
from domaingen.run.rundir import to_json  # noqa: E402

STEPS = [0, 10, 20]


def accs(algorithm: str, trial: int, s: int) -> dict[str, float | None]:
    """Distinct, tie-free accuracies; env0's in split is not evaluated at step 10 (a partial checkpoint)."""
    base = 0.5 + 0.1 * s + 0.01 * trial + (0.05 if algorithm == "DMG" else 0.0)
    out = {f"env{i}_{sp}_acc": round(base + 0.003 * i + (0.001 if sp == "out" else 0), 4) for i in range(3) for sp in ("in", "out")}
    if s == 1:
        out["env0_in_acc"] = None
    return out


def write_run(root: Path, algorithm: str, trial: int, done: bool = True) -> Path:
    run = root / f"{algorithm}_{trial}"
    run.mkdir(parents=True)
    args = {"dataset": "ColoredMNIST", "algorithm": algorithm, "test_envs": [2], "hparams_seed": 0, "trial_seed": trial}
    (run / "args.json").write_text(json.dumps(args))
    lines = []
    for s, step in enumerate(STEPS):
        record = {"step": step, "loss": 1.0 / (s + 1 + trial), **accs(algorithm, trial, s),
                  "hparams": {"lr": 1e-3}, "args": args, "data_source": "MNIST-70000"}
        if algorithm == "DMG":
            record.update({"nll": 0.5 / (s + 1), "penalty": 0.9 - 0.1 * s, "dmg_layer0_iou": 0.8 - 0.2 * s,
                           "dmg_iou": 0.7 - 0.2 * s, "dmg_layer0_shared": 3})
        lines.append(to_json(record))
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    if algorithm == "DMG":
        logits = torch.tensor([[2.0, -1.0, 0.0], [-3.0, 1.0, 0.5]])
        torch.save({"step": 20, "val_acc": 0.7, "model": {"masks.logits.0": logits, "classifier.weight": torch.ones(2, 3)}},
                   run / "selected.pt")
    if done:
        (run / "done").write_text("{}")
    return run


@pytest.fixture
def sweep(tmp_path) -> Path:
    root = tmp_path / "sweep"
    for algorithm in ("ERM", "DMG"):
        for trial in (0, 1):
            write_run(root, algorithm, trial)
    write_run(root, "ERM", 2, done=False)  # still running
    diagnostics = {"checkpoint": "selected", "step": 20, "layers": {"relu": {
        "train": {"selectivity_per_neuron": [0.1, 0.2, 0.25, 0.9]}, "test": {"selectivity_per_neuron": [0.05, 0.5, 0.55, 0.6]}}}}
    (root / "ERM_0" / "diagnostics.json").write_text(json.dumps(diagnostics))
    return root


def figures_by_name(report):
    return {f.name: f for f in report.figures}


def test_bars_are_the_selected_test_accuracies(sweep, tmp_path):
    report = build_report(sweep, tmp_path / "out", keep_figures=True)
    ax = figures_by_name(report)["bars_ColoredMNIST_training_test.png"].figure.axes[0]
    labels = [c.get_label() for c in ax.containers if hasattr(c, "patches")]
    heights = {label: [p.get_height() for p in c.patches] for label, c in zip(labels, [c for c in ax.containers if hasattr(c, "patches")])}
    # training-domain validation: the best mean out accuracy of env0, env1 is the last step of every run;
    # test accuracy = env2 in at step 20 (s = 2), mean over the two trials
    for algorithm in ("ERM", "DMG"):
        expected = np.mean([accs(algorithm, t, 2)["env2_in_acc"] for t in (0, 1)]) * 100
        assert heights[algorithm] == [pytest.approx(expected)]  # only env 2 was held out: one group
    data = report.figures[0].data
    assert data["environments"] == ["-90%"]
    values = np.array([accs("ERM", t, 2)["env2_in_acc"] for t in (0, 1)])
    assert data["bars"]["ERM"]["error"] == [pytest.approx(100 * np.std(values / math.sqrt(2)))]  # DomainBed's, ddof 0


def test_curves_plot_the_records_with_gaps(sweep, tmp_path):
    report = build_report(sweep, tmp_path / "out", keep_figures=True)
    figures = figures_by_name(report)
    lines = {line.get_label(): line for line in figures["ColoredMNIST_ERM_test_env_2_accuracy.png"].figure.axes[0].get_lines()}
    for env in range(3):
        for split in ("in", "out"):
            line = lines[f"env{env}{'*' if env == 2 else ''} {split}"]
            assert list(line.get_xdata()) == STEPS
            expected = [accs("ERM", 0, s)[f"env{env}_{split}_acc"] for s in range(3)]
            got = list(line.get_ydata())
            for e, g in zip(expected, got):
                assert (e is None and math.isnan(g)) or g == pytest.approx(e)
    loss_axes = figures["ColoredMNIST_DMG_test_env_2_losses.png"].figure.axes
    plotted = {ax.get_title(): list(ax.get_lines()[0].get_ydata()) for ax in loss_axes if ax.get_lines()}
    assert plotted == {"loss": pytest.approx([1.0, 0.5, 1 / 3]), "nll": pytest.approx([0.5, 0.25, 0.5 / 3]),
                       "penalty": pytest.approx([0.9, 0.8, 0.7])}
    mask_lines = {line.get_label(): list(line.get_ydata()) for line in figures["ColoredMNIST_DMG_test_env_2_masks.png"].figure.axes[0].get_lines()}
    assert mask_lines == {"dmg_layer0_iou": pytest.approx([0.8, 0.6, 0.4]), "dmg_iou": pytest.approx([0.7, 0.5, 0.3])}


def test_heatmap_and_selectivity_histograms(sweep, tmp_path):
    figures = figures_by_name(build_report(sweep, tmp_path / "out", keep_figures=True))
    image = figures["ColoredMNIST_DMG_test_env_2_heatmap.png"].figure.axes[0].get_images()[0]
    assert np.allclose(image.get_array(), torch.sigmoid(torch.tensor([[2.0, -1.0, 0.0], [-3.0, 1.0, 0.5]])).numpy())
    colorbar = image.colorbar  # the scale the colours read on: probabilities, fixed at 0 to 1
    assert colorbar.ax.get_ylabel() == "sigmoid(mask logit)" and tuple(colorbar.mappable.get_clim()) == (0.0, 1.0)
    ax = figures["ColoredMNIST_ERM_test_env_2_selectivity.png"].figure.axes[0]
    bins = np.linspace(0, 1, 21)
    heights = [p.get_height() for p in ax.patches]
    assert heights[:20] == np.histogram([0.1, 0.2, 0.25, 0.9], bins)[0].tolist()
    assert heights[20:] == np.histogram([0.05, 0.5, 0.55, 0.6], bins)[0].tolist()


def test_page_embeds_the_plotted_data_and_the_pngs(sweep, tmp_path, capsys):
    assert main(["-q", "report", str(sweep), "--output", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "index.html").read_text()
    data = json.loads(re.search(r'<script type="application/json" id="figure-data">(.*?)</script>', page, re.S).group(1))
    curves = data["figures"]["ColoredMNIST_DMG_test_env_2_accuracy.png"]
    assert curves["env1 out"]["y"] == [accs("DMG", 0, s)["env1_out_acc"] for s in range(3)]
    assert curves["env0 in"]["y"][1] is None
    assert "1 still running or incomplete" in page and "training-domain validation" in page
    assert "(data: MNIST-70000; protocol: paired)" in page
    pngs = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    assert len(pngs) == len(data["figures"]) and page.count("data:image/png;base64,") == len(pngs)


def test_a_sweep_without_finished_runs_gives_a_page_that_says_so(tmp_path, capsys):
    write_run(tmp_path / "sweep", "ERM", 0, done=False)
    assert main(["-q", "report", str(tmp_path / "sweep"), "--output", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "index.html").read_text()
    assert f"No finished run in {tmp_path / 'sweep'} yet (1 incomplete, 0 failed)" in page


def test_report_of_a_missing_directory_is_one_line(tmp_path, capsys):
    assert main(["-q", "report", str(tmp_path / "nowhere"), "--output", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == f"domaingen: error: sweep directory {tmp_path / 'nowhere'} is not a directory"


def test_unknown_selection_is_one_line(sweep, tmp_path, capsys):
    assert main(["-q", "report", str(sweep), "--output", str(tmp_path / "out"), "--selection", "best"]) == 2
    assert capsys.readouterr().err.strip() == (
        "domaingen: error: unknown selection 'best'; valid selections: training, loo, oracle, last")


def test_synthetic_sweep_of_the_benchmark_collects(tmp_path):
    from domaingen.bench.benchmarks import write_synthetic_sweep
    from domaingen.tables.collect import collect

    assert write_synthetic_sweep(tmp_path, n_runs=80, records_per_run=2) == 160
    collection = collect(tmp_path)
    assert collection.records["run"].nunique() == 80 and len(collection.records) == 160
    assert set(collection.records["algorithm"]) >= {"ERM", "DMG", "ERM+ModReg"}


def test_html_tables_number_missing_cells_and_caveats_as_markdown_does():
    from domaingen.inspect.report import table_html
    from domaingen.tables.reporting import Cell, Table

    table = Table("T", "Toy/training/test", ["env0", "env1", "Avg"], {
        "ERM": [Cell(values=[.5]), Cell(missing="no done run with test env 1 (1 failed)"),
                Cell(missing="1 environment(s) missing")],
        "IRM": [Cell(values=[.25], footnote="a caveat"), Cell(missing="no done run with test env 1 (1 failed)"),
                Cell(missing="1 environment(s) missing")],
    })
    page = table_html(table, "caption")
    cells = re.findall(r"<td(?: class=\"[^\"]*\")?>([^<]*)</td>", page)
    assert cells == ["ERM", "50.0", "missing [1]", "missing [2]", "IRM", "25.0 [3]", "missing [1]", "missing [2]"]
    assert re.findall(r'<p class="note">([^<]*)</p>', page) == [
        "[1] no done run with test env 1 (1 failed).", "[2] 1 environment(s) missing.", "[3] a caveat."]
