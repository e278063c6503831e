"""`domaingen report`: one static HTML page of a sweep, with its tables and figures (matplotlib: the `plots` extra).

The page holds `collect`'s tables, a bar chart of test accuracy per algorithm and test
environment, and for the selected run of each cell (dataset, algorithm, test environment:
the first trial of the hyperparameters that training-domain validation selects) its
accuracy and loss curves, its mask curves and heatmaps, and the selectivity histograms
of its diagnostics.json when `diagnose` has been run. Figures are PNG files beside the
page and embedded in it, so the page also stands alone; the data each figure plots is
embedded too (a JSON block), so the numbers can be checked against the records.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from domaingen.inspect.masks_over_trials import masks_matrix_tables
from domaingen.inspect.masks_x_domains import SECTION as MASKS_X_DOMAINS, applied
from domaingen.tables.collect import Collection, collect
from domaingen.errors import DomaingenError
from domaingen.tables.reporting import (
    build_tables,
    cell_notes,
    done_runs,
    error_note,
    note_lines,
    short_cell_text,
    table_marks,
)
from domaingen.run.loggers import SYSTEM
from domaingen.run.rundir import DONE, FAILED, RESULTS, SELECTED, read_jsonl
from domaingen.tables.selection import default_selection_methods, select, selection_method, selection_method_names

log = logging.getLogger(__name__)

ACC = re.compile(r"^env(\d+)_(in|out)_acc$")
LOSS = re.compile(r"(loss|nll|penalty|_s\d)$|^loss")
MASK_CURVE = re.compile(r"(iou|kept_fraction)$")
DPI = 90
PAGE_WIDTH = 12.0  # inches: at DPI, the page's 1100 px column, so such a figure is shown unscaled
FONT = 10  # points: 12.5 px at DPI


class _Figures:
    """Figures made with matplotlib's object API (no pyplot state: nothing stays open, no GUI backend)."""

    def __init__(self) -> None:
        from matplotlib.figure import Figure

        self.Figure = Figure

    def subplots(self, nrows: int = 1, ncols: int = 1, *, figsize, dpi, squeeze: bool = True, layout: str | None = None):
        fig = self.Figure(figsize=figsize, dpi=dpi, layout=layout)
        return fig, fig.subplots(nrows, ncols, squeeze=squeeze)

    def mosaic(self, layout: list[list[str]], *, figsize, dpi, **gridspec) -> tuple[Any, dict[str, Any]]:
        """A constrained-layout figure and its named axes (matplotlib's subplot_mosaic)."""
        fig = self.Figure(figsize=figsize, dpi=dpi, layout="constrained")
        return fig, fig.subplot_mosaic(layout, gridspec_kw=gridspec)

    def close(self, fig) -> None:
        fig.clear()


def _pyplot() -> _Figures:
    try:
        return _Figures()
    except ImportError:
        raise DomaingenError("domaingen report needs matplotlib: pip install 'domaingen-bench[plots]'") from None


@dataclass
class FigureSpec:
    """One figure of the page: its file name, caption, the matplotlib figure and the data it plots."""

    name: str
    caption: str
    figure: Any
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    """What `build_report` wrote."""

    page: Path
    figures: list[FigureSpec]
    message: str


# ---- which runs ----------------------------------------------------------------


def run_overrides(run_dir: Path) -> dict[str, Any]:
    """A run's explicit `--hparams` overrides (args.json, else its first record's args); {} when none."""
    args: Any = None
    if (run_dir / "args.json").is_file():
        try:
            args = json.loads((run_dir / "args.json").read_text())
        except json.JSONDecodeError:
            args = None
    if not isinstance(args, dict):
        first = next(iter(read_jsonl(run_dir / RESULTS)), None) if (run_dir / RESULTS).is_file() else None
        args = (first or {}).get("args") if isinstance(first, dict) else None
    overrides = (args or {}).get("hparams") if isinstance(args, dict) else None
    if isinstance(overrides, str):  # DomainBed's args hold the --hparams JSON string
        try:
            overrides = json.loads(overrides)
        except json.JSONDecodeError:
            overrides = None
    return overrides if isinstance(overrides, dict) else {}


def overrides_text(overrides: str) -> str:
    """'activation=identity, lr=0.05' for the JSON of a run's overrides; '' for none."""
    return ", ".join(f"{k}={v}" for k, v in json.loads(overrides or "{}").items())


def selected_runs(records: pd.DataFrame, method: str = "training",
                  overrides: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per cell (dataset, algorithm, test_env) and set of `--hparams` overrides: the first trial of
    the hyperparameters `select` chooses, as it returns it (its `run` directory, `step`, accuracies).

    `overrides` maps a run to the JSON of its overrides (sorted keys; a run not in it has none).
    Runs of one cell that differ in their overrides (an ablation such as a ReLU network and its
    linear twin) are selected apart, so each keeps its own run and step; column `overrides`.
    """
    variant = records["run"].map(lambda run: (overrides or {}).get(run, "{}"))
    parts = [select(group, method).assign(overrides=key)
             for key, group in records.assign(overrides=variant).groupby("overrides", sort=True)]
    parts = [part for part in parts if len(part)]
    if not parts:
        return pd.DataFrame()
    chosen = pd.concat(parts, ignore_index=True)
    chosen = chosen.assign(plain=chosen["overrides"] != "{}")  # a cell's run without overrides first
    chosen = chosen.sort_values(["dataset", "algorithm", "test_env", "plain", "overrides", "trial_seed"], kind="stable")
    chosen = chosen.drop_duplicates(["dataset", "algorithm", "test_env", "overrides"], keep="first")
    return chosen.drop(columns="plain").reset_index(drop=True)


def run_records(run_dir: Path) -> list[dict[str, Any]]:
    """A run's records in step order."""
    return sorted((r for r in read_jsonl(run_dir / RESULTS) if isinstance(r.get("step"), int)), key=lambda r: r["step"])


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key`; a missing or null value is NaN (a checkpoint may skip a split)."""
    xs, ys = [], []
    for r in records:
        value = r.get(key)
        xs.append(r["step"])
        ys.append(float(value) if isinstance(value, (int, float)) and value is not None else math.nan)
    return xs, ys


def _numeric_keys(records: Sequence[dict[str, Any]]) -> list[str]:
    keys: dict[str, None] = {}
    for r in records:
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", *SYSTEM):
                keys.setdefault(k, None)
    return list(keys)


def _wrap(text: str, width_in: float, fontsize: float) -> str:
    """`text` broken into lines that fit `width_in` inches at `fontsize` points (about 0.55 em a character)."""
    import textwrap

    return textwrap.fill(text, max(20, int(width_in * 72 / (0.55 * fontsize))))


# ---- figures -------------------------------------------------------------------


def accuracy_bars(table, plt, error: str = "domainbed") -> FigureSpec:
    """Grouped bars: test accuracy (%) per held-out environment (groups) and algorithm (bars),
    ± the tables' error bar (`error`: "domainbed", "se" or "std", as `collect --error`)."""
    envs = [c for c in table.columns if not c.startswith("Avg")]
    algorithms = list(table.rows)
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(envs) * max(1, len(algorithms)) / 2 + 2), 3.4), dpi=DPI,
                           layout="constrained")
    width = 0.8 / max(1, len(algorithms))
    data: dict[str, Any] = {"environments": envs, "bars": {}}
    for k, algorithm in enumerate(algorithms):
        cells = table.rows[algorithm][: len(envs)]
        heights = [100 * c.mean if c.values else math.nan for c in cells]
        errors = [100 * c.spread(error) if c.n > 1 else 0.0 for c in cells]
        x = np.arange(len(envs)) + (k - (len(algorithms) - 1) / 2) * width
        # a cell of one trial has no error bar: NaN draws none, where 0 would draw a cap
        shown = [e if c.n > 1 else math.nan for e, c in zip(errors, cells)]
        ax.bar(x, np.nan_to_num(heights), 0.9 * width, yerr=shown, capsize=3, label=algorithm)
        data["bars"][algorithm] = {"mean": heights, "error": errors}
    ax.set_xticks(np.arange(len(envs)), envs)
    ax.set_xlabel("held-out environment")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 100)
    # beside the axes, never over a bar
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_title(table.title, fontsize=9)
    key = re.sub(r"\W+", "_", table.key)
    caption = f"{table.title}: mean over trials; {error_note(error, [table], averages=False)}."
    return FigureSpec(f"bars_{key}.png", caption, fig, data)


def accuracy_curves(name: str, label: str, records, test_envs, step: int | None, plt) -> FigureSpec:
    """Every environment's in (solid) and out (dashed) accuracy over steps; the selected step marked."""
    fig, ax = plt.subplots(figsize=(5.5, 3.2), dpi=DPI, layout="constrained")
    data: dict[str, Any] = {}
    envs = sorted({int(m.group(1)) for r in records for k in r if (m := ACC.match(k))})
    sparse = False
    for env in envs:
        for split, style in (("in", "-"), ("out", "--")):
            xs, ys = _series(records, f"env{env}_{split}_acc")
            tag = f"env{env}{'*' if env in test_envs else ''} {split}"
            gaps = any(math.isnan(y) for y in ys)
            sparse = sparse or gaps
            # a split evaluated at a few checkpoints only shows as open circles, not a line
            ax.plot(xs, ys, style, marker="o" if gaps else ".", fillstyle="none" if gaps else "full",
                    color=f"C{env}", label=tag)
            data[tag] = {"x": xs, "y": ys}
    if step is not None:
        ax.axvline(step, color="grey", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(_wrap(f"{label}: accuracy per environment (* held out)", 5.0, 9), fontsize=9)
    caption = (f"{label}: accuracy of every environment's in and out split; "
               f"the grey line marks the selected checkpoint (step {step}).")
    if sparse:
        eval_splits = (records[0].get("args") or {}).get("eval_splits", "all")
        caption += (f" Open circles: splits this run evaluated only at some checkpoints (--eval_splits "
                    f"{eval_splits}: what model selection reads, the held-out environment at the selected and "
                    "last checkpoints); a run with --eval_splits all draws full curves.")
    return FigureSpec(f"{name}_accuracy.png", caption, fig, data)


def small_multiples(name: str, label: str, records, keys: Sequence[str], what: str, plt) -> FigureSpec:
    """One small panel per record field over steps (fields of different scales side by side); at least
    half the page wide, laid out by matplotlib's constrained layout so no title or tick label is cut."""
    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    width = max(PAGE_WIDTH / 2, 3.6 * cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width, 0.7 + 2.5 * rows), dpi=DPI, squeeze=False,
                             layout="constrained")
    data: dict[str, Any] = {}
    for ax, key in zip(axes.flat, keys):
        xs, ys = _series(records, key)
        ax.plot(xs, ys, marker=".", label=key)
        ax.set_title(key, fontsize=FONT)
        ax.set_xlabel("step", fontsize=FONT - 1)
        ax.tick_params(labelsize=FONT - 1)
        data[key] = {"x": xs, "y": ys}
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle(_wrap(f"{label}: {what}", width, FONT + 1), fontsize=FONT + 1)
    return FigureSpec(f"{name}_{what.split()[0]}.png", f"{label}: {what} over steps.", fig, data)


def mask_curves(name: str, label: str, records, keys: Sequence[str], plt) -> FigureSpec:
    """Mask statistics over steps on one axis (DMG's IoU per layer, ModReg's kept fraction per layer)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.2), dpi=DPI, layout="constrained")
    data: dict[str, Any] = {}
    for key in keys:
        xs, ys = _series(records, key)
        ax.plot(xs, ys, marker=".", label=key)
        data[key] = {"x": xs, "y": ys}
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("IoU / kept fraction")
    ax.legend(fontsize=6)
    ax.set_title(_wrap(f"{label}: mask IoU / kept fraction", 5.0, 9), fontsize=9)
    return FigureSpec(f"{name}_masks.png", f"{label}: mask statistics over steps (IoU between domains' masks, "
                      "fraction of weights kept).", fig, data)


def mask_heatmaps(name: str, label: str, matrices: dict[str, list[list[float]]], plt) -> FigureSpec:
    """Domain x neuron mask probabilities, one panel per masked layer."""
    fig, axes = plt.subplots(len(matrices), 1, figsize=(6, 0.9 + 0.9 * len(matrices)), dpi=DPI, squeeze=False,
                             layout="constrained")
    image = None
    for ax, (layer, matrix) in zip(axes[:, 0], matrices.items()):
        image = ax.imshow(np.array(matrix, dtype=float), aspect="auto", vmin=0, vmax=1, cmap="viridis",
                          interpolation="nearest")
        ax.set_title(layer, fontsize=8)
        ax.set_ylabel("domain", fontsize=7)
        ax.tick_params(labelsize=6)
    axes[-1, 0].set_xlabel("neuron (a channel where a convolution reads it)", fontsize=7)
    if image is not None:
        bar = fig.colorbar(image, ax=axes[:, 0].tolist(), fraction=0.04, pad=0.02)
        bar.set_label("sigmoid(mask logit)", fontsize=7)
        bar.ax.tick_params(labelsize=6)
    fig.suptitle(_wrap(f"{label}: sigmoid(mask logit) per domain (rows) and neuron", 6, 9), fontsize=9)
    return FigureSpec(f"{name}_heatmap.png", f"{label}: the selected model's per-domain neuron mask probabilities "
                      "(yellow: kept).", fig, {k: v for k, v in matrices.items()})


def _percent_heatmap(ax, values: np.ndarray, fmt: str):
    """`values` (%) as an annotated heatmap on the fixed 0-100 scale, so that figures compare;
    a NaN cell is grey with a dash."""
    from matplotlib import colormaps

    cmap = colormaps["viridis"].with_extremes(bad="0.85")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0, vmax=100, aspect="auto",
                      interpolation="nearest")
    for (r, c), v in np.ndenumerate(values):
        red, green, blue, _ = cmap(v / 100)  # NaN: the grey
        ax.text(c, r, "–" if np.isnan(v) else format(v, fmt), ha="center", va="center", fontsize=FONT,
                color="black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white")
    return image


def _environment_axis(ax, names: Sequence[str], splits: Sequence[str], test_envs: Sequence[int]) -> None:
    """Columns labelled by environment (* held out) and the split each reads; white lines beside held-out columns."""
    ax.set_xticks(range(len(names)), [f"{n}{'*' if i in test_envs else ''}\n({s})"
                                      for i, (n, s) in enumerate(zip(names, splits))], fontsize=FONT)
    ax.set_xlabel("environment (split it reads; * held out)", fontsize=FONT)
    for x in sorted({e + side for e in test_envs for side in (-0.5, 0.5)}):
        if -0.5 < x < len(names) - 0.5:
            ax.axvline(x, color="white", linewidth=3)


def _colorbar(fig, image, ax, label: str) -> None:
    bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    bar.set_label(label, fontsize=FONT)
    bar.ax.tick_params(labelsize=FONT)


SPLIT_NOTES = {"out": "(out): a training environment's validation split, which model selection reads",
               "idtest": "(idtest): a training environment's in-domain test split",
               "in": "(in): the held-out environment's in split, which the test tables report"}


def masks_x_domains_heatmap(name: str, label: str, matrix: dict[str, Any], plt, algorithm: str = "DMG",
                            source: str | None = None) -> FigureSpec:
    """The mask-by-domain matrix of `evaluate --masks_x_domains` (DMG's Table 4) as an annotated heatmap;
    for MultiHead the rows apply each domain's head. `source` replaces the caption's "evaluate
    --masks_x_domains, <checkpoint> checkpoint, step <step>" (a mean over trials says so)."""
    unit = applied(algorithm)
    values = np.array(matrix["accuracy"], dtype=float) * 100
    columns, train_rows = matrix["columns"], matrix["train_rows"]
    rows = [f"{unit} {row}" if k < train_rows else row for k, row in enumerate(matrix["rows"])]
    test_envs = list(matrix.get("test_envs", ()))
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 1.5 + 0.45 * len(rows)), dpi=DPI, layout="constrained")
    image = _percent_heatmap(ax, values, ".1f")
    _environment_axis(ax, columns, matrix["splits"], test_envs)
    ax.set_yticks(range(len(rows)), rows, fontsize=FONT)
    ax.axhline(train_rows - 0.5, color="white", linewidth=3)
    ax.set_ylabel(f"{unit} applied", fontsize=FONT)
    ax.set_title(f"{label}: each training domain's {unit} on every environment", fontsize=FONT + 1)
    _colorbar(fig, image, ax, "accuracy (%)")
    ensembles = {"Pred-Ens": f"Pred-Ens (the default prediction: the mean of the logits under every {unit})",
                 "Mask-Ens": "Mask-Ens (one network under the mean of the masks)"}
    splits = "; ".join(note for split, note in SPLIT_NOTES.items() if split in matrix["splits"])
    source = source or f"evaluate --masks_x_domains, {matrix.get('checkpoint')} checkpoint, step {matrix.get('step')}"
    caption = (f"{label}: accuracy (%) of each training domain's {unit} (known-domain prediction: rows "
               f"\"{unit} <environment>\") applied to every example of every environment, then "
               f"{' and '.join(ensembles[r] for r in matrix['rows'][train_rows:] if r in ensembles)} "
               f"({source}). "
               f"Each column reads one split, in brackets: {splits}; white lines set the held-out column(s) (*) "
               "apart. Colours span 0-100 % in every such figure, so algorithms compare.")
    return FigureSpec(f"{name}_masks_x_domains.png", caption, fig,
                      {"rows": rows, "columns": columns, "accuracy": matrix["accuracy"]})


def selectivity_histograms(name: str, label: str, diagnostics: dict[str, Any], plt) -> FigureSpec:
    """Per layer, the selectivity of its neurons on the training vs the held-out environments (at least half
    the page wide, constrained layout: a single layer's panel keeps its whole title)."""
    layers = {k: v for k, v in diagnostics.get("layers", {}).items() if "train" in v and "test" in v}
    width = max(PAGE_WIDTH / 2, 3.6 * max(1, len(layers)))
    fig, axes = plt.subplots(1, max(1, len(layers)), figsize=(width, 3.2), dpi=DPI, squeeze=False,
                             layout="constrained")
    data: dict[str, Any] = {}
    bins = np.linspace(0, 1, 21)
    for ax, (layer, entry) in zip(axes[0], layers.items()):
        for role, color in (("train", "C0"), ("test", "C3")):
            values = np.array([v for v in entry[role]["selectivity_per_neuron"] if v is not None], dtype=float)
            ax.hist(values, bins=bins, alpha=0.5, color=color, label=f"{role} (mean {np.nanmean(values):.2f})")
            data[f"{layer} {role}"] = values.tolist()
        ax.set_title(layer, fontsize=FONT)
        ax.set_xlabel("selectivity", fontsize=FONT - 1)
        ax.set_ylabel("neurons", fontsize=FONT - 1)
        ax.legend(fontsize=FONT - 1)
        ax.tick_params(labelsize=FONT - 1)
    fig.suptitle(_wrap(f"{label}: neuron selectivity, training vs held-out environments", width, FONT + 1),
                 fontsize=FONT + 1)
    return FigureSpec(f"{name}_selectivity.png", f"{label}: selectivity of each neuron (diagnostics.json, "
                      f"{diagnostics.get('checkpoint')} checkpoint, step {diagnostics.get('step')}).", fig, data)


PROBE_FIELD = re.compile(r"^fc_(acc|risk)_s([0-9.]+)$")
ACTIVATION_NAMES = {"relu": "ReLU", "identity": "linear (identity)", "gelu": "GELU", "tanh": "tanh",
                    "sigmoid": "sigmoid"}
CHANCE_RISK = math.log(2)  # cross-entropy of a two-class guess


def network_name(hparams: dict[str, Any]) -> str:
    """The network a FeatureContamination run trained: its TwoLayer activation ("ReLU", "linear
    (identity)"), or the featurizer's name when it is not TwoLayer."""
    featurizer = str(hparams.get("featurizer", "TwoLayer"))
    if featurizer != "TwoLayer":
        return f"{featurizer} featurizer"
    activation = str(hparams.get("activation", "relu")).lower()
    return f"{ACTIVATION_NAMES.get(activation, activation)} two-layer network"


def _listed_shifts(data_source: str, key: str) -> list[float]:
    """The shift strengths a FeatureContamination data_source lists under `key` ("shifts", "probes")."""
    found = re.search(rf"\b{key}=([0-9.,]+)", data_source or "")
    return [float(v) for v in found.group(1).split(",") if v] if found else []


def _probe_size(dataset: str | None) -> int | None:
    """Examples per probe set (the registered dataset's N_PROBE), None for an unknown dataset."""
    from domaingen.datasets import DATASETS

    return int(getattr(DATASETS.get(dataset), "N_PROBE", 0)) or None if dataset in DATASETS else None


SELECTED_LINE = {"color": "black", "linestyle": "--", "linewidth": 1}  # the selected step on over-steps panels


def _shifts_text(shifts: Sequence[float]) -> str:
    return ", ".join(f"{s:g}" for s in shifts) or "none"


def _over_steps_panels(axes: dict[str, Any], records, shifts: list[str], step: int, data: dict[str, Any]) -> None:
    """Top row: the mean projections, then probe accuracy and risk per shift s, over steps; the selected step
    as a dashed line, chance dotted; one legend of the shifts beside the risk panel."""
    from matplotlib import colormaps
    from matplotlib.lines import Line2D

    ax = axes["projections"]
    for key, color, text in (("fc_core_projection", "C0", "core: ‖W_j P_core‖"),
                             ("fc_background_projection", "C3", "background: ‖W_j P_bg‖")):
        xs, ys = _series(records, key)
        ax.plot(xs, ys, marker=".", color=color, label=text)
        data[key] = {"x": xs, "y": ys}
    ax.set_ylim(0, 1.4 * np.nanmax([data["fc_core_projection"]["y"], data["fc_background_projection"]["y"]]))
    ax.legend(fontsize=FONT - 1, loc="upper left")  # in the top quarter, which the ylim leaves empty
    ax.set_ylabel("mean over neurons j", fontsize=FONT)
    ax.set_title("first-layer weights W, projected", fontsize=FONT)
    colors = {s: colormaps["viridis"](j / max(1, len(shifts) - 1)) for j, s in enumerate(shifts)}
    for panel, what, chance, ylabel in (("accuracy", "acc", 0.5, "probe accuracy"),
                                        ("risk", "risk", CHANCE_RISK, "probe risk (cross-entropy)")):
        ax = axes[panel]
        for shift in shifts:
            xs, ys = _series(records, f"fc_{what}_s{shift}")
            ax.plot(xs, ys, marker=".", color=colors[shift])
            data[f"fc_{what}_s{shift}"] = {"x": xs, "y": ys}
        ax.axhline(chance, color="grey", linestyle=":", linewidth=1.2)
        ax.set_ylim(0, 1.02 if what == "acc" else None)
        ax.set_ylabel(ylabel, fontsize=FONT)
        ax.set_title(f"{panel} per background shift s", fontsize=FONT)
    for key in ("projections", "accuracy", "risk"):
        axes[key].axvline(step, **SELECTED_LINE)
        axes[key].set_xlabel("step", fontsize=FONT)
    handles = [Line2D([], [], color=colors[s], marker=".", label=f"s = {s}") for s in shifts]
    handles += [Line2D([], [], color="grey", linestyle=":", label="chance\n(0.5; ln 2)"),
                Line2D([], [], **SELECTED_LINE, label=f"selected\nstep {step}")]
    axes["risk"].legend(handles=handles, fontsize=FONT - 1, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                        title="probe shift", title_fontsize=FONT - 1)


def _dose_panel(ax, at: dict[str, Any], shifts: list[str], trained: list[float], held_out: list[float],
                data: dict[str, Any]):
    """Accuracy (left axis) and risk (right axis, returned) against the shift s at one checkpoint `at`;
    the training and held-out environments' shifts as vertical lines; the legend below the axes."""
    xs = [float(s) for s in shifts]
    accuracy = [float(at.get(f"fc_acc_s{s}", math.nan)) for s in shifts]
    risk = [float(at.get(f"fc_risk_s{s}", math.nan)) for s in shifts]
    ax.plot(xs, accuracy, "o-", color="C0", label="accuracy (left)")
    ax.axhline(0.5, color="C0", linestyle=":", linewidth=1.2, label="chance accuracy 0.5")
    for marked, style, what in ((trained, {"color": "0.45", "linewidth": 1.5}, "training shifts"),
                                (held_out, {"color": "C1", "linewidth": 2, "linestyle": "-."}, "held-out shift")):
        for k, s in enumerate(marked):
            ax.axvline(s, **style, label=f"{what} (s = {_shifts_text(marked)})" if k == 0 else None)
    ax.set(ylim=(0, 1.02), xlim=(-0.03, 1.03), xticks=xs)
    ax.set_xlabel("background shift s (background coefficients ~ U[-s, 1-s])", fontsize=FONT)
    ax.set_ylabel("probe accuracy", fontsize=FONT)
    ax.set_title(f"dose-response at the selected step {at['step']}", fontsize=FONT)
    twin = ax.twinx()
    twin.plot(xs, risk, "s--", color="C3", label="risk (right)")
    twin.set_ylim(0, 1.1 * np.nanmax(risk, initial=CHANCE_RISK))
    twin.set_ylabel("probe risk (cross-entropy)", fontsize=FONT, color="C3")
    twin.tick_params(colors="C3")
    ax.legend(handles=ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0],
              fontsize=FONT - 1, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
    data["dose_response"] = {"step": at["step"], "s": xs, "accuracy": accuracy, "risk": risk,
                             "training_shifts": trained, "held_out_shifts": held_out}
    return twin


def _neuron_panel(fig, ax, section: dict[str, Any], diagnostics: dict[str, Any], data: dict[str, Any]) -> str:
    """Each neuron's ‖W_j P_core‖ against ‖W_j P_bg‖ (equal scales from 0), coloured by its class asymmetry,
    never-positive neurons (NaN asymmetry) grey; returns the caption's sentences about it."""
    core = np.array(section["core_projection_per_neuron"], dtype=float)
    background = np.array(section["background_projection_per_neuron"], dtype=float)
    values = section.get("asymmetry_per_neuron") or []
    asym = np.array([math.nan if v is None else v for v in values], dtype=float)
    dead = np.isnan(asym)
    end = 1.08 * max(core.max(initial=0), background.max(initial=0)) or 1.0
    ax.plot([0, end], [0, end], color="grey", linestyle=":", linewidth=1, label="equal norms")
    if len(values):
        points = ax.scatter(core[~dead], background[~dead], c=asym[~dead], s=10, cmap="plasma", vmin=0.5, vmax=1.0)
        ax.scatter(core[dead], background[dead], s=10, color="0.55", label=f"never positive ({int(dead.sum())})")
        bar = fig.colorbar(points, cax=ax.inset_axes([1.04, 0.0, 0.05, 1.0]))  # beside the square axes
        bar.set_label("class asymmetry", fontsize=FONT)
        bar.ax.tick_params(labelsize=FONT)
    else:
        ax.scatter(core, background, s=10, color="C0")
    ax.set(xlim=(0, end), ylim=(0, end), aspect="equal")
    ax.legend(fontsize=FONT - 1, loc="upper left")
    ax.set_xlabel("‖W_j P_core‖", fontsize=FONT)
    ax.set_ylabel("‖W_j P_bg‖", fontsize=FONT)
    ax.set_title(f"each neuron j (diagnose, step {diagnostics.get('step')})", fontsize=FONT)
    data["per_neuron"] = {"core": core.tolist(), "background": background.tolist(), "asymmetry": asym.tolist(),
                          "never_positive": int(dead.sum()) if len(values) else None}
    envs = [e for e in diagnostics.get("environments", []) if e.get("role") == "train"]
    examples = ", ".join(f"{e['name']}: {e['examples']}" for e in envs)
    return (f" Bottom right (domaingen diagnose, {diagnostics.get('checkpoint')} checkpoint, step "
            f"{diagnostics.get('step')}): each neuron j's two projections (its weights W_j; on the dotted diagonal "
            "they are equal), coloured by its class asymmetry, the share of its positive pre-activation "
            "Σ_i max(h_j(x_i), 0) that comes from its dominant class (0.5: both classes alike, 1: one class only)"
            + (f", over the training environments' held-out (out) examples ({examples})" if examples else "")
            + (f"; {int(dead.sum())} of {len(core)} neurons are never positive on them (grey: no asymmetry)."
               if len(values) else "; no asymmetry was recorded."))


def contamination_figures(name: str, label: str, records, diagnostics: dict[str, Any] | None, plt,
                          step: int | None = None, test_envs: Sequence[int] = ()) -> list[FigureSpec]:
    """FeatureContamination runs (records with `fc_*` fields), one figure of five panels. Over steps, with
    the selected step marked: the first-layer weights' projections onto the core and background subspaces,
    and accuracy and risk on every background-shift probe. At the selected step (the last record's when
    `step` has none): accuracy and risk against the shift s (the dose-response), training and held-out
    shifts marked. With diagnostics.json: each neuron's two projections coloured by its class-activation
    asymmetry (never-positive neurons grey)."""
    if not any("fc_background_projection" in r for r in records):
        return []
    section = ((diagnostics or {}).get("sections", {}).get("feature_contamination", {}) or {}).get("first_layer")
    first = records[0]
    network = network_name(first.get("hparams") or {})
    at = next((r for r in records if r["step"] == step), records[-1])
    step = at["step"]
    shifts = sorted({m.group(2) for r in records for k in r if (m := PROBE_FIELD.match(k))}, key=float)
    train = _listed_shifts(first.get("data_source", ""), "shifts")
    held_out = [s for i, s in enumerate(train) if i in test_envs]
    trained = [s for s in train if s not in held_out]

    fig, axes = plt.mosaic([["projections", "accuracy", "risk"], ["dose", "dose", "neurons" if section else "."]],
                           figsize=(PAGE_WIDTH, 7.4), dpi=DPI, height_ratios=[1, 1.15])
    data: dict[str, Any] = {}
    _over_steps_panels(axes, records, shifts, step, data)
    twin = _dose_panel(axes["dose"], at, shifts, trained, held_out, data)
    about_neurons = _neuron_panel(fig, axes["neurons"], section, diagnostics, data) if section else (
        " Run domaingen diagnose on the run to add each neuron's projections.")
    if section and diagnostics.get("step") != step:
        about_neurons += f" These neurons are at step {diagnostics.get('step')}, not at the selected step {step}."
    for ax in [*axes.values(), twin]:
        ax.tick_params(labelsize=FONT)
    title = f"{label}: feature contamination, {network}" + (" (selected step 0: untrained)" if step == 0 else "")
    fig.suptitle(_wrap(title, PAGE_WIDTH, FONT + 1), fontsize=FONT + 1, color="C3" if step == 0 else "black")

    n_probe = _probe_size(first.get("dataset") or (first.get("args") or {}).get("dataset"))
    caption = (f"{label}: feature contamination in the {network}. "
               + ("Warning: the selected step is 0, the network after its first update: validation found no "
                  "better checkpoint, so these panels describe an untrained network. " if step == 0 else "")
               + "Top, over steps: the mean over neurons j of ‖W_j P_core‖ and ‖W_j P_bg‖, the norms of neuron "
               "j's first-layer weights W_j projected (P_core, P_bg) onto the core subspace (which carries the "
               "label) and onto the background subspace (independent of the label); accuracy and risk "
               f"(cross-entropy) on probe sets of {n_probe or 'fixed'} examples each, with fresh core coefficients "
               "and background coefficients ~ U[-s, 1-s] (s = 0: the training distribution U[0, 1]; s = 1: "
               "U[-1, 0]); chance: accuracy 0.5, risk ln 2. The dashed line marks the selected checkpoint, step "
               f"{step}. Bottom left: accuracy and risk against s at step {step} (the dose-response); grey lines "
               f"mark the training environments' shifts ({_shifts_text(trained)}), the orange one the held-out "
               f"environment's ({_shifts_text(held_out)}).")
    return [FigureSpec(f"{name}_contamination.png", caption + about_neurons, fig, data)]


def _share(fraction: float) -> str:
    """A fraction as a percentage that keeps a tiny one visible (0.0006%, not 0.0%)."""
    percent = 100 * fraction
    return f"{percent:.1f}%" if percent >= 1 or percent == 0 else f"{percent:.2g}%"


def _span(accuracies: Sequence[float]) -> str:
    return f"{100 * min(accuracies):.0f}-{100 * max(accuracies):.0f} %"


def _kept_fractions(masks: dict[str, Any]) -> list[float | None]:
    """Each domain mask's share of all masked weights (from the per-layer kept fractions); None without layers."""
    layers = (masks.get("layers") or {}).values()
    total = sum(layer["weights"] for layer in layers)
    return [sum(layer["kept_fraction"][d] * layer["weights"] for layer in layers) / total if total else None
            for d in range(len(masks["domains"]))]


def domain_mask_figures(name: str, label: str, diagnostics: dict[str, Any] | None, plt) -> list[FigureSpec]:
    """`diagnose --domain_masks` (Csordás et al.'s tests): accuracy heatmaps of each training domain's mask,
    the control mask and the unmasked network on every environment, kept and inverted (same rows), the
    asymmetric sharing s(t, r) of the domains' masks, and the histogram of every mask's keep probabilities."""
    masks = (diagnostics or {}).get("domain_masks") or {}
    if "accuracy_matrix" not in masks:
        return []
    names, test_envs, domains = masks["environments"], masks.get("test_envs", []), masks["domains"]
    control = masks["control"]
    kept_shares = _kept_fractions(masks) + [control.get("kept_fraction")]
    rows = [f"mask {d}" for d in domains] + ["control"]
    kept_labels = [f"{row} (kept {_share(k)})" if k is not None else row for row, k in zip(rows, kept_shares)]
    unmasked = masks["unmasked_accuracy"]
    kept = 100 * np.array(masks["accuracy_matrix"] + [control["accuracy"], unmasked], dtype=float)
    inverted = 100 * np.array(masks["inverted_accuracy_matrix"] + [control["inverted_accuracy"],
                                                                   [math.nan] * len(names)], dtype=float)
    sharing = 100 * np.array(masks.get("sharing") or np.full((len(domains),) * 2, math.nan), dtype=float)

    fig, axes = plt.mosaic([["kept", "inverted"], ["sharing", "histogram"]], dpi=DPI,
                           figsize=(PAGE_WIDTH, 2.6 + 0.4 * (len(rows) + 1 + len(domains))),
                           height_ratios=[len(rows) + 2, len(domains) + 2])
    fig.get_layout_engine().set(hspace=0.08)  # the top row's axis labels apart from the bottom row's titles
    splits = ["in" if i in test_envs else "out" for i in range(len(names))]
    for key, matrix, labels, title in (
            ("kept", kept, kept_labels + ["unmasked"], "accuracy (%) with the mask"),
            ("inverted", inverted, [f"{row} inverted" for row in rows] + ["unmasked"],
             "accuracy (%) with the mask inverted (only the weights it removed)")):
        ax = axes[key]
        image = _percent_heatmap(ax, matrix, ".0f")
        _environment_axis(ax, names, splits, test_envs)
        ax.set_yticks(range(len(labels)), labels, fontsize=FONT)
        ax.axhline(len(domains) - 0.5, color="white", linewidth=3)
        ax.set_ylabel("mask trained on", fontsize=FONT)
        ax.set_title(title, fontsize=FONT)
    _colorbar(fig, image, [axes["kept"], axes["inverted"]], "accuracy, s(t, r) (%)")

    ax = axes["sharing"]
    _percent_heatmap(ax, sharing, ".0f")
    ax.set_xticks(range(len(domains)), domains, fontsize=FONT)
    ax.set_yticks(range(len(domains)), [f"mask {d}" for d in domains], fontsize=FONT)
    ax.set_xlabel("r: mask trained on", fontsize=FONT)
    ax.set_ylabel("t: mask trained on", fontsize=FONT)
    ax.set_title("s(t, r): share (%) of t's kept weights that r keeps", fontsize=FONT)

    ax = axes["histogram"]
    counts = masks["probability_histogram"]["counts"]
    edges = np.linspace(0, 1, int(masks["probability_histogram"]["bins"]) + 1)
    for k, (mask, values) in enumerate(counts.items()):
        values = np.array(values, dtype=float)
        ax.stairs(np.where(values > 0, values, math.nan), edges,  # an empty bin draws nothing (log scale)
                  label="control" if mask == "control" else f"mask {mask}",
                  color="black" if mask == "control" else f"C{k}", linestyle="--" if mask == "control" else "-")
    ax.axvline(0.5, color="grey", linestyle=":", label="keep threshold p = 0.5")
    ax.set_yscale("log")
    ax.set_xlim(0, 1)
    ax.set_xlabel("keep probability p = sigmoid(mask logit)", fontsize=FONT)
    ax.set_ylabel("weights", fontsize=FONT)
    ax.set_title("keep probabilities of every masked weight", fontsize=FONT)
    ax.legend(fontsize=FONT - 1, loc="upper right")
    for a in axes.values():
        a.tick_params(labelsize=FONT)
    fig.suptitle(f"{label}: domain weight masks (alpha {masks.get('alpha')}, {masks.get('steps')} steps)",
                 fontsize=FONT + 1)

    caption = (f"{label}: Csordás et al.'s tests on per-domain weight masks (diagnose --domain_masks): accuracy (%) "
               "of each domain's mask, of a control mask trained on every training domain and of the unmasked "
               "network on every environment (row labels: the share of the masked weights each mask keeps), of "
               "the same masks inverted (only the weights they removed; the unmasked network has no inverse), the "
               "asymmetric sharing s(t, r) = |M_t ∩ M_r| / |M_t| over all masked weights, and the distribution of "
               "keep probabilities (a weight is kept when p > 0.5). Columns read a training environment's (out) "
               "split, the held-out one's (in) split (*), the first "
               f"{(diagnostics or {}).get('max_examples', 'all')} examples of each. A control mask that loses "
               "accuracy means alpha is too strong.")
    if control.get("kept_fraction", 1) < 0.01:
        caption += f" Here the control mask keeps {_share(control['kept_fraction'])} of the weights, almost nothing"
        if np.mean(control["accuracy"]) < np.mean(unmasked) - 0.05:
            caption += (f", and its accuracy ({_span(control['accuracy'])}) is far below the unmasked network's "
                        f"({_span(unmasked)}): alpha {masks.get('alpha')} is too strong for these masks to tell "
                        "which weights a domain needs; rerun with a smaller --mask_alpha")
        caption += "."
    data = {"environments": [f"{e}{'*' if i in test_envs else ''}" for i, e in enumerate(names)],
            "rows": rows + ["unmasked"], "kept_fraction": kept_shares, "accuracy": (kept / 100).tolist(),
            "inverted_accuracy": (inverted / 100).tolist(), "sharing": masks.get("sharing"), "histogram": counts}
    return [FigureSpec(f"{name}_domain_masks.png", caption, fig, data)]


def mask_matrices(run_dir: Path, diagnostics: dict[str, Any] | None) -> dict[str, list[list[float]]]:
    """Domain x neuron mask probabilities: diagnostics.json's sections, else the selected weights' `masks.logits.*`."""
    if diagnostics:
        found = {f"{layer}": entry["probs"] for section in diagnostics.get("sections", {}).values()
                 if isinstance(section, dict) for layer, entry in section.items()
                 if isinstance(entry, dict) and isinstance(entry.get("probs"), list)}
        if found:
            return found
    if not (run_dir / SELECTED).exists():
        return {}
    import torch

    state = torch.load(run_dir / SELECTED, map_location="cpu", weights_only=False)["model"]
    return {k: torch.sigmoid(v.float()).tolist() for k, v in state.items() if "masks.logits" in k and v.dim() == 2}


def run_figures(run_dir: Path, label: str, test_envs: Sequence[int], step: int | None, plt,
                name: str | None = None) -> list[FigureSpec]:
    """The figures of one selected run (file names start with `name`, default: from `label`); every
    caption ends with the run directory and the selected step."""
    records = run_records(run_dir)
    if not records:
        return []
    name = name or re.sub(r"\W+", "_", label)
    figures = [accuracy_curves(name, label, records, test_envs, step, plt)]
    keys = _numeric_keys(records)
    losses = [k for k in keys if LOSS.search(k) and not ACC.match(k) and not k.startswith("fc_")]
    if losses:
        figures.append(small_multiples(name, label, records, losses, "losses", plt))
    masks = [k for k in keys if MASK_CURVE.search(k) and not k.startswith("env")]
    if masks:
        figures.append(mask_curves(name, label, records, masks, plt))
    diagnostics = None
    if (run_dir / "diagnostics.json").exists():
        try:
            diagnostics = json.loads((run_dir / "diagnostics.json").read_text())
        except json.JSONDecodeError:
            log.warning("skipping unreadable %s", run_dir / "diagnostics.json")
    matrices = mask_matrices(run_dir, diagnostics)
    if matrices:
        figures.append(mask_heatmaps(name, label, matrices, plt))
    if diagnostics and diagnostics.get("layers"):
        figures.append(selectivity_histograms(name, label, diagnostics, plt))
    figures += contamination_figures(name, label, records, diagnostics, plt, step, test_envs)
    figures += domain_mask_figures(name, label, diagnostics, plt)
    if diagnostics and isinstance(diagnostics.get(MASKS_X_DOMAINS), dict):
        algorithm = (records[0].get("args") or {}).get("algorithm") or diagnostics.get("algorithm", "")
        figures.append(masks_x_domains_heatmap(name, label, diagnostics[MASKS_X_DOMAINS], plt, algorithm))
    for spec in figures:
        spec.caption += f" Run {run_dir.name}, selected step {step}."
    return figures


# ---- the page ------------------------------------------------------------------

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:1.5em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th:first-child,td:first-child{text-align:left}caption{caption-side:top;text-align:left;font-weight:600;padding:.3em 0}
figure{margin:1em 0}figcaption,.note{font-size:.9em;color:#555}.note{margin:-1em 0 1.5em}.missing{color:#a33;font-style:italic}
img{max-width:100%}h2{border-bottom:1px solid #ddd;padding-bottom:.2em}"""


def table_html(table, caption: str) -> str:
    """One `collect` table as HTML, with a caption, the footnotes of its marked cells and the numbered
    notes of its missing cells and caveats (as in Markdown)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["Algorithm", *table.columns])
    numbered = cell_notes(table)
    body = []
    for algorithm, cells in table.rows.items():
        tds = "".join(f'<td class="{"" if c.values else "missing"}">{html.escape(short_cell_text(c, numbered))}</td>'
                      for c in cells)
        body.append(f"<tr><td>{html.escape(algorithm)}</td>{tds}</tr>")
    lines = [f"{mark} {text}." for mark, text in table_marks(table)] + note_lines(numbered)
    notes = "".join(f'<p class="note">{html.escape(line)}</p>' for line in lines)
    return f"<table><caption>{html.escape(caption)}</caption><tr>{head}</tr>{''.join(body)}</table>{notes}"


def _figure_html(spec: FigureSpec, png: bytes) -> str:
    encoded = base64.b64encode(png).decode()
    return (f'<figure id="{html.escape(spec.name)}"><img alt="{html.escape(spec.caption)}" '
            f'src="data:image/png;base64,{encoded}"><figcaption>{html.escape(spec.caption)} '
            f'(<a href="{html.escape(spec.name)}">{html.escape(spec.name)}</a>)</figcaption></figure>')


def _page(title: str, parts: Sequence[str], data: dict[str, Any]) -> str:
    blob = json.dumps(data, allow_nan=True).replace("</", "<\\/").replace("NaN", "null")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>{''.join(parts)}"
            f'<script type="application/json" id="figure-data">{blob}</script></body></html>\n')


def _states(root: Path) -> dict[str, int]:
    counts = {"done": 0, "failed": 0, "incomplete": 0}
    for child in root.iterdir():
        if child.is_dir() and ((child / "args.json").exists() or (child / RESULTS).exists()):
            state = "done" if (child / DONE).exists() else "failed" if (child / FAILED).exists() else "incomplete"
            counts[state] += 1
    return counts


def _write_figures(figures: list[FigureSpec], output: Path, plt) -> list[str]:
    parts = []
    for spec in figures:
        buffer = io.BytesIO()
        spec.figure.savefig(buffer, format="png", dpi=DPI)
        png = buffer.getvalue()
        (output / spec.name).write_bytes(png)
        parts.append(_figure_html(spec, png))
        plt.close(spec.figure)
    return parts


def build_report(sweep_dir: str | Path, output_dir: str | Path, selection: str = "training",
                 keep_figures: bool = False, workers: int | None = None) -> Report:
    """Write index.html and its PNGs for the sweep in `sweep_dir` into `output_dir` (see the module docstring).

    A sweep with no finished run gives a page that says so. `keep_figures` leaves the
    matplotlib figures open in the result (for tests that read their data back).
    `workers` processes render the selected runs' figures (default: the CPU count, at most 4).
    """
    plt = _pyplot()
    root, output = Path(sweep_dir), Path(output_dir)
    if not root.is_dir():
        raise DomaingenError(f"sweep directory {root} is not a directory")
    if selection not in selection_method_names():
        raise DomaingenError(f"unknown selection '{selection}'; valid selections: {', '.join(selection_method_names())}")
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DomaingenError(f"cannot create {output}: {exc.strerror}") from None
    title = f"domaingen report: {root.resolve().name}"
    page = output / "index.html"
    try:
        collection = collect(root)
    except DomaingenError:
        counts = _states(root)
        if counts["done"]:
            raise  # done runs that cannot be tabulated together (two protocols, mixed sources): say why
        message = (f"No finished run in {root} yet ({counts['incomplete']} incomplete, {counts['failed']} failed). "
                   "Rerun domaingen report when runs are done.")
        page.write_text(_page(title, [f"<p class='missing'>{html.escape(message)}</p>"], {"figures": {}}))
        return Report(page, [], message)
    parts, figures = [_status_html(collection)], []
    records = collection.records
    methods = [selection] + [m for m in default_selection_methods(has_pairs=False) if m != selection]
    tables = build_tables(collection, methods)
    sources = ", ".join(sorted(str(s) for s in records.get("data_source", pd.Series(dtype=str)).dropna().unique())) or "unknown"
    parts.append("<h2>Tables</h2>")
    for table in tables:
        caption = table.caption() if callable(getattr(table, "caption", None)) else f"{table.title}. Data: {sources}."
        parts.append(table_html(table, caption))
    parts.append(f"<p>{html.escape(error_note('domainbed', tables))}</p>")
    test_tables = [t for t in tables if t.key.endswith(f"/{selection}/test")]
    parts.append(f"<h2>Test accuracy ({html.escape(selection_method(selection).description)})</h2>")
    bar_figures = [accuracy_bars(t, plt) for t in test_tables]
    figures += bar_figures
    parts += _figures_html(bar_figures, output, plt, keep_figures)
    parts += _ranks_html(tables, selection, output, plt, keep_figures, figures)
    parts += _masks_over_trials_html(collection, root, output, plt, keep_figures, figures)
    run_dirs = {run: root / run if (root / run).is_dir() else root for run in records["run"].unique()}
    overrides = {run: json.dumps(run_overrides(path), sort_keys=True) for run, path in run_dirs.items()}
    chosen = selected_runs(records, selection, overrides)
    parts.append(f"<h2>Selected runs ({html.escape(selection_method(selection).description)}; first trial of each cell "
                 "and each set of --hparams overrides)</h2>")
    cells = ["dataset", "algorithm", "test_env"]
    variants = chosen.groupby(cells)["overrides"].transform("nunique") if len(chosen) else []
    if any(n > 1 for n in variants):
        parts.append("<p>Some cells hold runs that differ only in their --hparams overrides (labelled in brackets). "
                     "The tables above treat them as competing hyperparameter draws and report the one that "
                     "validation selects; this section shows the selected run of each set of overrides.</p>")
    jobs = [_run_job(row, run_dirs[row.run], n > 1) for row, n in zip(chosen.itertuples(), variants)]
    if keep_figures:
        rendered = [[(f, _png(f)) for f in run_figures(Path(d), label, envs, step, plt, name)]
                    for d, name, label, envs, step in jobs]
    else:
        rendered = _render_in_parallel(jobs, workers)
    for row, (_, _, label, _, _), specs in zip(chosen.itertuples(), jobs, rendered):
        text = overrides_text(row.overrides)
        parts.append(f"<h3>{html.escape(label)}</h3><p>run <code>{html.escape(str(row.run))}</code>, hparams_seed "
                     f"{row.hparams_seed}, trial_seed {row.trial_seed}, selected step {row.step}"
                     f"{', --hparams ' + html.escape(text) if text else ''}</p>")
        for spec, png in specs:
            if not keep_figures:
                (output / spec.name).write_bytes(png)
            parts.append(_figure_html(spec, png))
        figures += [spec for spec, _ in specs]
    page.write_text(_page(title, parts, {"figures": {f.name: f.data for f in figures}}))
    message = f"wrote {page} ({len(figures)} figures, {len(chosen)} selected runs)"
    return Report(page, figures, message)


def _ranks_html(tables, selection: str, output: Path, plt, keep_figures: bool, figures: list[FigureSpec]) -> list[str]:
    """The critical-difference diagram of `collect ranks` over the datasets, or one line on why there is none."""
    from domaingen.inspect.cd_diagram import critical_difference_figure
    from domaingen.tables.across_datasets import ranks

    parts = [f"<h2>Average ranks over datasets ({html.escape(selection_method(selection).description)})</h2>"]
    try:
        [summary] = ranks(tables, [selection])
    except DomaingenError as exc:
        return parts + [f"<p class='missing'>{html.escape(str(exc))}</p>"]
    spec = FigureSpec(*critical_difference_figure(summary, plt, DPI))
    figures.append(spec)
    return parts + _figures_html([spec], output, plt, keep_figures)


def _figures_html(specs: list[FigureSpec], output: Path, plt, keep_figures: bool) -> list[str]:
    """The figures' HTML: written to PNG files beside the page, or inlined (and kept open) for tests."""
    return [_figure_html(f, _png(f)) for f in specs] if keep_figures else _write_figures(specs, output, plt)


def _masks_over_trials_html(collection: Collection, root: Path, output: Path, plt, keep_figures: bool,
                            figures: list[FigureSpec]) -> list[str]:
    """The section of `collect masks-x-domains`'s mean matrices as heatmaps (none when no run has a matrix);
    the figures are appended to `figures`."""
    try:
        tables = [t for t in masks_matrix_tables(collection, root) if t.cells]
    except DomaingenError:
        return []
    specs = []
    for t in tables:
        trials = f"{len(t.trials)} trial{'s' if len(t.trials) > 1 else ''}"
        label = f"{t.dataset} {t.algorithm} (test env {t.test_env}), mean of {trials}"
        name = re.sub(r"\W+", "_", f"mean_{t.dataset}_{t.algorithm}_{t.test_env}")
        left_out = f"; left out: {'; '.join(t.unevaluated)}" if t.unevaluated else ""
        source = (f"mean over trials {t.trials} of the runs training-domain validation selects, at their selected "
                  f"steps {', '.join(map(str, t.steps))}{left_out}; collect masks-x-domains prints the ± per cell")
        specs.append(masks_x_domains_heatmap(name, label, t.matrix, plt, t.algorithm, source))
    figures += specs
    parts = ["<h2>Every mask (or head) on every domain, mean over trials (training-domain validation)</h2>"]
    parts += _figures_html(specs, output, plt, keep_figures)
    return parts


Job = tuple[str, str, str, list[int], int]  # run directory, figure name stem, label, test envs, selected step


def _run_job(row: Any, run_dir: Path, several: bool) -> Job:
    """The figures' job of one row of `selected_runs`; `several`: its cell has runs with other overrides."""
    cell = f"{row.dataset} {row.algorithm} test env {row.test_env}"
    text = overrides_text(row.overrides)
    label = f"{cell} ({text})" if text else f"{cell} (no --hparams overrides)" if several else cell
    return str(run_dir), re.sub(r"\W+", "_", f"{cell} {text}").strip("_"), label, [int(row.test_env)], int(row.step)


def _render_run(job: Job) -> list[tuple[FigureSpec, bytes]]:
    """One selected run's figures as (spec without its matplotlib figure, PNG bytes): picklable, for a worker process."""
    run_dir, name, label, test_envs, step = job
    plt = _pyplot()
    out = []
    for spec in run_figures(Path(run_dir), label, test_envs, step, plt, name):
        png = _png(spec)
        plt.close(spec.figure)
        out.append((FigureSpec(spec.name, spec.caption, None, spec.data), png))
    return out


def _render_in_parallel(jobs: list, workers: int | None) -> list[list[tuple[FigureSpec, bytes]]]:
    import os
    from concurrent.futures import ProcessPoolExecutor

    workers = workers or min(4, os.cpu_count() or 1)
    if workers < 2 or len(jobs) < 4:
        return [_render_run(job) for job in jobs]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_render_run, jobs, chunksize=max(1, len(jobs) // (4 * workers))))


def _png(spec: FigureSpec) -> bytes:
    buffer = io.BytesIO()
    spec.figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _status_html(collection: Collection) -> str:
    done = collection.records["run"].nunique()
    parts = [done_runs(done)]
    if collection.incomplete:
        parts.append(f"{len(collection.incomplete)} still running or incomplete (not shown)")
    if collection.failed:
        parts.append(f"{len(collection.failed)} failed")
    return f"<p>{html.escape(', '.join(parts))}.</p>"
