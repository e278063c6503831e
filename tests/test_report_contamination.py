"""`domaingen report` on FeatureContamination runs that differ only in an `--hparams` override (a ReLU
network and its linear twin): each run keeps its own directory and selected step, and every panel plots
the records' numbers, read back from the figures and compared with the run's files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from domaingen.datasets import DATASETS  # noqa: E402
from domaingen.inspect.report import DPI, PAGE_WIDTH, build_report, run_overrides, selected_runs  # noqa: E402
from domaingen.run.rundir import to_json  # noqa: E402
from domaingen.tables.collect import collect  # noqa: E402
from domaingen.tables.selection import select  # noqa: E402

STEPS = [0, 10, 20]
SHIFTS = ["0", "0.25", "0.5", "0.75", "1"]
# run directory: (--hparams overrides, the hidden activation, the step training-domain validation selects)
RUNS = {"relu": ({}, "relu", 20), "linear": ({"activation": "identity"}, "identity", 0)}
ASYMMETRY = {"relu": [0.6, None, 0.9, None, 0.75, 0.55], "linear": [0.5, 0.7, None, 0.8, 0.95, 0.65]}


def record(run: str, k: int) -> dict:
    """Checkpoint k of `run`: its validation accuracy peaks at its selected step; fc_* values distinct per run."""
    overrides, activation, selected = RUNS[run]
    offset = 0.01 if run == "linear" else 0.0
    val = 0.9 - 0.1 * abs(STEPS[k] - selected) / 10 + offset
    accs = {f"env{i}_{split}_acc": round(val + 0.001 * i, 4) for i in range(3) for split in ("in", "out")}
    fc = {"fc_core_projection": 0.2 + 0.1 * k + offset, "fc_background_projection": 0.2 + 0.02 * k + offset}
    for j, s in enumerate(SHIFTS):
        fc[f"fc_acc_s{s}"] = round(0.95 - 0.1 * j - 0.01 * k - offset, 4)
        fc[f"fc_risk_s{s}"] = round(0.2 + 0.3 * j + 0.02 * k + offset, 4)
    args = {"dataset": "FeatureContamination", "algorithm": "ERM", "test_envs": [2], "hparams_seed": 0,
            "trial_seed": 0, "hparams": overrides}
    return {"step": STEPS[k], "loss": 0.7 - 0.1 * k, **accs, **fc, "args": args,
            "hparams": {"featurizer": "TwoLayer", "activation": activation},
            "data_source": DATASETS.get("FeatureContamination").describe()}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fc") / "sweep"
    for run, (overrides, _, selected) in RUNS.items():
        path = root / run
        path.mkdir(parents=True)
        (path / "args.json").write_text(json.dumps(record(run, 0)["args"]))
        (path / "results.jsonl").write_text("".join(to_json(record(run, k)) + "\n" for k in range(len(STEPS))))
        (path / "done").write_text("{}")
        n = len(ASYMMETRY[run])
        section = {"core_projection_per_neuron": [0.1 * (j + 1) for j in range(n)],
                   "background_projection_per_neuron": [0.05 * (n - j) for j in range(n)],
                   "asymmetry_per_neuron": ASYMMETRY[run]}
        envs = [{"index": i, "name": f"s={s}", "role": "train", "split": "out", "examples": 200}
                for i, s in enumerate(("0", "0.1"))]
        layers = {"featurizer.act": {role: {"selectivity_per_neuron": [0.1, 0.4, 0.45, 0.9]}
                                     for role in ("train", "test")}}
        (path / "diagnostics.json").write_text(json.dumps({
            "checkpoint": "selected", "step": selected, "environments": envs, "layers": layers,
            "sections": {"feature_contamination": {"first_layer": section}}}))
    return root


@pytest.fixture(scope="module")
def report(sweep):
    return build_report(sweep, sweep.parent / "out", keep_figures=True)


def own_figures(report, run: str) -> dict:
    """`run`'s figures by kind ('accuracy', 'contamination', ...): the linear run's names carry its override."""
    prefix = "FeatureContamination_ERM_test_env_2_" + ("activation_identity_" if run == "linear" else "")
    return {f.name.removeprefix(prefix).removesuffix(".png"): f for f in report.figures
            if f.name.startswith(prefix) and "_" not in f.name.removeprefix(prefix)}


def vertical_lines(ax) -> list[float]:
    """The x of every vertical line (axvline) on `ax`."""
    return [line.get_xdata()[0] for line in ax.get_lines()
            if len(line.get_xdata()) == 2 and len(set(line.get_xdata())) == 1]


def test_selected_runs_keep_each_override_sets_run_and_step(sweep):
    records = collect(sweep).records
    overrides = {run: json.dumps(run_overrides(sweep / run), sort_keys=True) for run in RUNS}
    chosen = selected_runs(records, "training", overrides)
    assert dict(zip(chosen["run"], chosen["step"])) == {run: selected for run, (_, _, selected) in RUNS.items()}
    assert list(chosen["run"]) == ["relu", "linear"]  # the run without overrides first
    # without the overrides, one row: the run and step select() chose, not another run of the same seeds
    pooled, chosen = select(records, "training"), selected_runs(records, "training")
    assert len(chosen) == 1 and (chosen["run"][0], chosen["step"][0]) == (pooled["run"][0], pooled["step"][0])


def test_each_runs_figures_name_its_own_run_and_step(report):
    page = report.page.read_text()
    for run, (_, activation, selected) in RUNS.items():
        figures = own_figures(report, run)
        assert set(figures) == {"accuracy", "losses", "selectivity", "contamination"}
        for spec in figures.values():
            assert spec.caption.endswith(f" Run {run}, selected step {selected}.")
        assert f"run <code>{run}</code>, hparams_seed 0, trial_seed 0, selected step {selected}" in page
        # the accuracy curves are this run's records, the grey line at its selected step
        ax = figures["accuracy"].figure.axes[0]
        line = next(line for line in ax.get_lines() if line.get_label() == "env0 out")
        assert list(line.get_ydata()) == pytest.approx([record(run, k)["env0_out_acc"] for k in range(3)])
        assert vertical_lines(ax) == [selected]
        title = figures["contamination"].figure.texts[0].get_text().replace("\n", " ")
        network = "ReLU" if activation == "relu" else "linear (identity)"
        assert f"{network} two-layer network" in title
        assert f"feature contamination in the {network} two-layer network" in figures["contamination"].caption
        assert ("Warning: the selected step is 0" in figures["contamination"].caption) == (selected == 0)
    assert "--hparams activation=identity" in page


def test_contamination_panels_plot_the_records_at_the_selected_step(report):
    for run, (_, _, selected) in RUNS.items():
        spec = own_figures(report, run)["contamination"]
        axes = {ax.get_label(): ax for ax in spec.figure.axes}
        at = record(run, STEPS.index(selected))
        dose = axes["dose"]
        risk = next(ax for ax in spec.figure.axes if ax is not dose and ax.get_shared_x_axes().joined(ax, dose))  # twinx
        assert list(dose.get_lines()[0].get_xdata()) == [float(s) for s in SHIFTS]
        assert list(dose.get_lines()[0].get_ydata()) == pytest.approx([at[f"fc_acc_s{s}"] for s in SHIFTS])
        assert list(risk.get_lines()[0].get_ydata()) == pytest.approx([at[f"fc_risk_s{s}"] for s in SHIFTS])
        # training shifts 0 and 0.1 (grey), the held-out 0.2 (test env 2), chance 0.5
        assert sorted(vertical_lines(dose)) == [0.0, 0.1, 0.2]
        assert any(list(line.get_ydata()) == [0.5, 0.5] for line in dose.get_lines())
        for panel, what in (("accuracy", "acc"), ("risk", "risk")):
            curves = [line for line in axes[panel].get_lines() if len(line.get_xdata()) == len(STEPS)]
            assert len(curves) == len(SHIFTS)
            for line, s in zip(curves, SHIFTS):
                assert list(line.get_ydata()) == pytest.approx([record(run, k)[f"fc_{what}_s{s}"] for k in range(3)])
            assert vertical_lines(axes[panel]) == [selected]
        background = axes["projections"].get_lines()[1]
        assert list(background.get_ydata()) == pytest.approx([record(run, k)["fc_background_projection"] for k in range(3)])
        assert vertical_lines(axes["projections"]) == [selected]


def test_never_positive_neurons_are_grey_and_counted(report, sweep):
    for run in RUNS:
        spec = own_figures(report, run)["contamination"]
        ax = next(ax for ax in spec.figure.axes if ax.get_label() == "neurons")
        diagnostics = json.loads((sweep / run / "diagnostics.json").read_text())
        section = diagnostics["sections"]["feature_contamination"]["first_layer"]
        asymmetry = section["asymmetry_per_neuron"]
        nan = sum(v is None for v in asymmetry)
        coloured, grey = ax.collections
        assert len(grey.get_offsets()) == nan and np.allclose(grey.get_facecolor()[0][:3], 0.55)
        assert list(coloured.get_array()) == pytest.approx([v for v in asymmetry if v is not None])
        # the points are the neurons' projections; both axes from 0 at one scale
        alive = [j for j, v in enumerate(asymmetry) if v is not None]
        core = section["core_projection_per_neuron"]
        assert coloured.get_offsets()[:, 0].tolist() == pytest.approx([core[j] for j in alive])
        assert ax.get_xlim() == ax.get_ylim() and ax.get_xlim()[0] == 0 and ax.get_aspect() == 1.0
        assert f"; {nan} of {len(asymmetry)} neurons are never positive on them (grey" in spec.caption
        n_probe = DATASETS.get("FeatureContamination").N_PROBE
        assert "(s=0: 200, s=0.1: 200)" in spec.caption and f"probe sets of {n_probe} examples each" in spec.caption


def test_small_figures_keep_their_titles_inside(report):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for kind in ("losses", "selectivity", "contamination"):
        figure = own_figures(report, "linear")[kind].figure
        canvas = FigureCanvasAgg(figure)
        canvas.draw()
        renderer = canvas.get_renderer()
        width, height = figure.bbox.width, figure.bbox.height
        assert width >= PAGE_WIDTH / 2 * DPI - 1
        title = figure.texts[0].get_window_extent(renderer)
        assert 0 <= title.x0 and title.x1 <= width and title.y1 <= height
        for ax in figure.axes:  # no panel's title or tick labels cross the figure's title or edges
            box = ax.get_tightbbox(renderer)
            assert box.y1 <= title.y0 + 1 and box.x0 >= -1 and box.x1 <= width + 1, (kind, ax.get_label())
    assert math.isclose(PAGE_WIDTH * DPI, 1080)
