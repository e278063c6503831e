"""`collect domain-masks`: the weight masks `diagnose --domain_masks` trained, per run, beside Csordás et al.'s numbers.

`domaingen diagnose RUN --domain_masks` trains one weight mask per training domain on the
frozen network and writes their statistics to RUN/diagnostics.json (inspect/diagnose.py).
This view reads them from every run of a sweep, a run directory or a records bundle and,
per (dataset, algorithm, held-out environments), prints two tables:

- per quantity, one column per run (trial) and their mean ± error: each domain's kept
  weights (share of all masked weights), the weight ratio of every domain to the first
  (AddMul: mul/add, the paper's 3.8x), the IoU of every pair of domains' masks over all
  weights, each mask's accuracy on its own domain beside the unmasked network's, each mask
  and its inversion (only the weights it removed) on every other training domain (double
  addition's reuse test), the control mask's (every training domain together) kept weights
  and accuracy, and the masks' stability across mask seeds (per run: mean ± std over pairs of
  seeds; `diagnose --mask_seed S1 S2 ...`);
- per layer, input to output, the kept weights per domain, the IoU between domains and the
  seed IoU, and the input and output layers pooled against the hidden ones (IoU pooled:
  the summed intersections over the summed unions).

The paper's numbers sit in a column beside ours, from domaingen/tables/published/csordas.csv
(`--reference` names another file of its columns: dataset (empty: every dataset), quantity,
mean, error, claim, source). Accuracy and IoU are in percent there and here.
"""

from __future__ import annotations

import io
import math
import os
import re
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from tabulate import tabulate

from domaingen.errors import DomaingenError
from domaingen.tables.collect import Collection
from domaingen.tables.diagnostics import run_diagnostics
from domaingen.tables.reference import PUBLISHED_DIR
from domaingen.tables.reporting import ERROR_TITLES, Cell, latex_document, latex_text_table

SECTION = "domain_masks"
DEFAULT_REFERENCE = "csordas"
# the quantities a published file may give, and whether its mean is a percentage
QUANTITIES = {"weight_ratio": False, "seed_iou": True, "layer_sharing": True, "inverted": True}
PUBLISHED_COLUMNS = ("dataset", "quantity", "mean", "error", "claim", "source")
FORMATS = ("markdown", "latex", "csv")
COMMAND = "domaingen diagnose RUN --domain_masks"


@dataclass
class Published:
    """One published number (or claim) and where it comes from."""

    quantity: str
    mean: float = math.nan
    error: float = math.nan
    mean_text: str = ""
    error_text: str = ""
    claim: str = ""
    source: str = ""

    def text(self) -> str:
        if self.mean_text:
            return self.mean_text + (f" ± {self.error_text}" if self.error_text else "")
        return self.claim


@dataclass
class Entry:
    """A quantity over runs (NaN: a run without it); `spreads`, each run's own ± (seed IoU: std over seed pairs)."""

    values: list[float]
    percent: bool = True
    spreads: list[float] | None = None

    def present(self) -> list[float]:
        return [v for v in self.values if not math.isnan(v)]

    def cell(self) -> Cell:
        return Cell(values=self.present(), percent=self.percent)

    def _number(self, value: float, spread: float) -> str:
        """A percentage with one decimal, another quantity (a ratio) with two; ' ± spread' unless NaN."""
        scale, digits = (100, ".1f") if self.percent else (1, ".2f")
        return f"{scale * value:{digits}}" + ("" if math.isnan(spread) else f" ± {scale * spread:{digits}}")

    def text(self, error: str = "domainbed") -> str:
        """The mean over the runs that have it ± their error; '-' for none."""
        cell = self.cell()
        if not cell.values:
            return "-"
        return self._number(cell.mean, cell.spread(error) if cell.shows_error() else math.nan)

    def run_text(self, i: int) -> str:
        """Run i's value (with its own ± where it has one); '-' when it lacks it."""
        value = self.values[i]
        if math.isnan(value):
            return "-"
        return self._number(value, self.spreads[i] if self.spreads else math.nan)


@dataclass
class Row:
    label: str
    entries: list[Entry | str]  # one per value column; a str is printed as it is
    paper: Published | None = None


@dataclass
class MaskRun:
    """One run's domain_masks section and where it was computed."""

    run: str
    trial_seed: int
    hparams_seed: int
    step: int
    section: dict[str, Any]


@dataclass
class DomainMaskTables:
    """One (dataset, algorithm, held-out environments): the summary and the per-layer table."""

    dataset: str
    algorithm: str
    test_envs: tuple[int, ...]
    domains: list[str]
    runs: list[MaskRun]
    summary: list[Row] = field(default_factory=list)
    layer_columns: list[str] = field(default_factory=list)
    layers: list[Row] = field(default_factory=list)
    without: list[str] = field(default_factory=list)  # runs of this key that have no domain masks

    @property
    def title(self) -> str:
        held_out = ",".join(map(str, self.test_envs))
        return (f"{self.dataset}, {self.algorithm}, test env {held_out}: weight masks per training domain "
                f"({', '.join(self.domains)})")

    def run_columns(self) -> list[str]:
        trials = [r.trial_seed for r in self.runs]
        return [f"trial {r.trial_seed}" + (f", hparams {r.hparams_seed}" if trials.count(r.trial_seed) > 1 else "")
                for r in self.runs]


# ---- published numbers ----

def read_published(name: str | os.PathLike = DEFAULT_REFERENCE) -> list[tuple[str, Published]]:
    """(dataset or '' for every dataset, number) of a published-numbers file: a path, or a shipped file's name."""
    path = Path(name)
    if not (path.is_file() or path.suffix or len(path.parts) > 1):
        path = PUBLISHED_DIR / f"{name}.csv"
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise DomaingenError(f"reference file {path} not found") from None
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError):
        raise DomaingenError(f"reference file {path} is not a readable CSV with the columns "
                             f"{', '.join(PUBLISHED_COLUMNS)}") from None
    missing = [c for c in PUBLISHED_COLUMNS if c not in frame.columns]
    if missing:
        raise DomaingenError(f"reference file {path} lacks the column(s) {', '.join(missing)}; collect domain-masks "
                             f"reads {', '.join(PUBLISHED_COLUMNS)}")
    out = []
    for i, row in enumerate(frame.to_dict("records")):
        where = f"reference file {path} line {i + 2}"
        quantity = row["quantity"].strip()
        if quantity not in QUANTITIES:
            raise DomaingenError(f"{where}: quantity {quantity!r} is not one of {', '.join(QUANTITIES)}")
        numbers = []
        for column in ("mean", "error"):
            text = row[column].strip()
            try:
                numbers.append(float(text) if text else math.nan)
            except ValueError:
                raise DomaingenError(f"{where}: {column} {text!r} is not a number") from None
        if math.isnan(numbers[0]) and not row["claim"].strip():
            raise DomaingenError(f"{where}: neither a mean nor a claim; give one of them")
        scale = 100 if QUANTITIES[quantity] else 1
        out.append((row["dataset"].strip(), Published(quantity, numbers[0] / scale, numbers[1] / scale,
                                                      row["mean"].strip(), row["error"].strip(),
                                                      row["claim"].strip(), row["source"].strip())))
    return out


def _paper(published: list[tuple[str, Published]], dataset: str, quantity: str) -> Published | None:
    """The dataset's own number for `quantity`, else one given for every dataset."""
    mine = [p for d, p in published if d == dataset and p.quantity == quantity]
    shared = [p for d, p in published if d == "" and p.quantity == quantity]
    return (mine or shared or [None])[0]


# ---- reading the runs ----

def _natural_key(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def layer_order(section: dict[str, Any]) -> list[str]:
    """The masked layers from input to output: as diagnose lists them, else by name with numbers in order."""
    return list(section.get("layer_order") or sorted(section["layers"], key=_natural_key))


def mask_runs(collection: Collection, root: str | os.PathLike) -> tuple[dict[tuple, list[MaskRun]], dict[tuple, list[str]]]:
    """Per (dataset, algorithm, test_envs): the runs whose diagnostics.json under `root` has domain masks, in
    trial order, and the runs that have none."""
    runs = collection.records.drop_duplicates("run").sort_values(["dataset", "algorithm", "trial_seed",
                                                                 "hparams_seed", "run"])
    found: dict[tuple, list[MaskRun]] = {}
    without: dict[tuple, list[str]] = {}
    for row in runs.to_dict("records"):
        key = (row["dataset"], row["algorithm"], tuple(row["test_envs"]))
        diagnostics = run_diagnostics(root, row["run"]) or {}
        section = diagnostics.get(SECTION)
        if not isinstance(section, dict):
            without.setdefault(key, []).append(str(row["run"]))
            continue
        found.setdefault(key, []).append(MaskRun(str(row["run"]), int(row["trial_seed"]), int(row["hparams_seed"]),
                                                 int(diagnostics.get("step", -1)), section))
    if not found:
        raise DomaingenError(f"no run here has domain masks: run `{COMMAND}` on its runs first")
    return found, without


# ---- the quantities ----

def _pooled_iou(layers: Sequence[dict[str, Any]], i: int, j: int) -> float:
    """IoU of masks i and j over several layers together: summed intersections over summed unions (the
    intersection is s(i, j) |M_i|)."""
    inter = union = 0.0
    for layer in layers:
        kept_i, kept_j = layer["kept_weights"][i], layer["kept_weights"][j]
        both = layer["sharing"][i][j] * kept_i if kept_i else 0.0
        inter += both
        union += kept_i + kept_j - both
    return inter / union if union else math.nan


def _seed_values(run: MaskRun, domains: Sequence[str], layer: str | None = None) -> tuple[float, float]:
    """(mean, std) of the run's seed IoU: over all masked weights (`layer` None: every domain's seed pairs
    pooled, std ddof 0) or one layer's mean over domains (std NaN); NaN without seed_stability."""
    stability = run.section.get("seed_stability")
    if not stability:
        return math.nan, math.nan
    per_domain = stability["domains"]
    if layer is not None:
        return float(np.mean([per_domain[d]["layers"][layer] for d in domains])), math.nan
    pairs = [v for d in domains for v in per_domain[d]["pairs"]]
    return (float(np.mean(pairs)), float(np.std(pairs))) if pairs else (math.nan, math.nan)


def _summary(table: DomainMaskTables, published: list[tuple[str, Published]]) -> list[Row]:
    runs, domains = table.runs, table.domains
    n_runs = len(runs)

    def row(label: str, values: list[float], percent: bool = True, spreads: list[float] | None = None,
            paper: str | None = None) -> Row:
        entry = Entry([float("nan") if v is None else float(v) for v in values], percent, spreads)
        return Row(label, [*([entry] * n_runs), entry],
                   _paper(published, table.dataset, paper) if paper else None)

    def env(run: MaskRun, name: str) -> int:
        return run.section["environments"].index(name)

    total = sum(layer["weights"] for layer in runs[0].section["layers"].values())
    rows = [row(f"kept weights, {d} (% of {total:,})", [r.section["kept_weights"][k] / total for r in runs])
            for k, d in enumerate(domains)]
    rows += [row(f"weight ratio {d}/{domains[0]}", [r.section["weight_ratio"][k][0] for r in runs], percent=False,
                 paper="weight_ratio") for k, d in enumerate(domains) if k]
    rows += [row(f"IoU({domains[i]}, {domains[j]}), all weights",
                 [_pooled_iou(list(r.section["layers"].values()), i, j) for r in runs])
             for i, j in combinations(range(len(domains)), 2)]
    for k, d in enumerate(domains):
        rows.append(row(f"accuracy on {d}, {d}'s mask", [r.section["accuracy"][k]["masked"] for r in runs]))
        rows.append(row(f"accuracy on {d}, unmasked", [r.section["accuracy"][k]["unmasked"] for r in runs]))
    for t, e in ((t, e) for t in range(len(domains)) for e in range(len(domains)) if t != e):
        rows.append(row(f"accuracy on {domains[e]}, {domains[t]}'s mask",
                        [r.section["accuracy_matrix"][t][env(r, domains[e])] for r in runs]))
        rows.append(row(f"accuracy on {domains[e]}, {domains[t]}'s mask inverted",
                        [r.section["inverted_accuracy_matrix"][t][env(r, domains[e])] for r in runs],
                        paper="inverted"))
    rows.append(row("control mask (every domain): kept weights", [r.section["control"]["kept_fraction"] for r in runs]))
    rows += [row(f"accuracy on {d}, control mask", [r.section["control"]["accuracy"][env(r, d)] for r in runs])
             for d in domains]
    for d in domains:
        seeds = [_seed_values(r, [d]) for r in runs]
        rows.append(row(f"seed IoU, {d}", [m for m, _ in seeds], spreads=[s for _, s in seeds]))
    seeds = [_seed_values(r, domains) for r in runs]
    rows.append(row("seed IoU, all masks", [m for m, _ in seeds], spreads=[s for _, s in seeds], paper="seed_iou"))
    return rows


def _layers(table: DomainMaskTables, published: list[tuple[str, Published]]) -> tuple[list[str], list[Row]]:
    runs, domains = table.runs, table.domains
    pairs = list(combinations(range(len(domains)), 2))
    columns = ["role", "weights"] + [f"kept {d}" for d in domains] + \
              [f"IoU({domains[i]}, {domains[j]})" for i, j in pairs] + ["seed IoU"]
    order = layer_order(runs[0].section)
    last = len(order) - 1
    roles = {name: "input" if k == 0 else "output" if k == last else "hidden" for k, name in enumerate(order)}
    if len(order) == 1:
        roles[order[0]] = "input, output"

    def entries(names: Sequence[str], seed: bool) -> list[Entry | str]:
        layers = [[r.section["layers"][n] for n in names] for r in runs]
        weights = sum(runs[0].section["layers"][n]["weights"] for n in names)
        kept = [Entry([sum(layer["kept_weights"][k] for layer in per_run) / weights for per_run in layers])
                for k in range(len(domains))]
        iou = [Entry([_pooled_iou(per_run, i, j) for per_run in layers]) for i, j in pairs]
        seed_iou = Entry([_seed_values(r, domains, names[0])[0] for r in runs]) if seed else "-"
        return [f"{weights:,}", *kept, *iou, seed_iou]

    rows = [Row(name, [roles[name], *entries([name], True)]) for name in order]
    io_layers = [n for n in order if roles[n] != "hidden"]
    hidden = [n for n in order if roles[n] == "hidden"]
    if io_layers and hidden:
        rows.append(Row("input and output layers", ["pooled", *entries(io_layers, False)],
                        _paper(published, table.dataset, "layer_sharing")))
        rows.append(Row("hidden layers", ["pooled", *entries(hidden, False)]))
    return columns, rows


def domain_mask_tables(collection: Collection, root: str | os.PathLike,
                       reference: str | os.PathLike = DEFAULT_REFERENCE) -> list[DomainMaskTables]:
    """The tables of every (dataset, algorithm, test_envs) some run of which has domain masks under `root`
    (the folder the collection's runs are in; tables/diagnostics.py). Raises DomaingenError when no run
    has any, or when one key's runs masked different domains or layers (different set-ups: collect apart)."""
    published = read_published(reference)
    found, without = mask_runs(collection, root)
    tables = []
    for key in sorted(found):
        runs = found[key]
        domains = list(runs[0].section["domains"])
        shapes = {(tuple(r.section["domains"]), tuple(sorted(r.section["layers"]))) for r in runs}
        if len(shapes) > 1:
            raise DomaingenError(f"{key[0]} {key[1]}: the runs' masks differ in their domains or layers (different "
                                 "set-ups in one sweep): collect them apart")
        table = DomainMaskTables(key[0], key[1], key[2], domains, runs, without=without.get(key, []))
        table.summary = _summary(table, published)
        table.layer_columns, table.layers = _layers(table, published)
        tables.append(table)
    return tables


# ---- printing ----

def _notes(table: DomainMaskTables, error: str) -> list[str]:
    notes = []
    for column, run in zip(table.run_columns(), table.runs):
        s = run.section
        seeds = " ".join(map(str, s.get("mask_seeds") or [])) or "the run's seed"
        notes.append(f"{column}: run {run.run}, masks of step {run.step}, {s['steps']} mask steps per mask "
                     f"(batch {s['batch_size']}, lr {s['mask_lr']:g}), alpha {s['alpha']:g}, mask seeds {seeds}.")
    notes.append("Kept weights: the share of all masked weights (every Linear and Conv2d weight) a mask keeps; weight "
                 "ratio: kept weights of one mask over the first's. Accuracies on a training domain's held-out (out) "
                 "split; an inverted mask keeps only the weights the mask removed; the control mask is trained on "
                 "every training domain together at the same alpha. Seed IoU per trial: mean ± std (ddof 0) over "
                 "pairs of mask seeds.")
    notes.append(f"mean column: over the trials that have the quantity; {ERROR_TITLES[error]}.")
    papers = {id(r.paper): r for r in table.summary + table.layers if r.paper}
    notes += [f"paper ({r.label}): {r.paper.source}." for r in papers.values()]
    if table.without:
        notes.append(f"Runs without domain masks (run `{COMMAND}` on them): {', '.join(table.without)}.")
    return notes


def _text_rows(table: DomainMaskTables, error: str) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """(headers, rows) of the summary table and of the per-layer table, as printed."""
    summary_header = ["quantity", *table.run_columns(), "mean", "paper"]
    summary = []
    for row in table.summary:
        *per_run, mean = row.entries
        summary.append([row.label, *[e.run_text(i) for i, e in enumerate(per_run)], mean.text(error),
                        row.paper.text() if row.paper else ""])
    layer_header = ["layer", *table.layer_columns, "paper"]
    layers = [[row.label, *[e if isinstance(e, str) else e.text(error) for e in row.entries],
               row.paper.text() if row.paper else ""] for row in table.layers]
    return summary_header, summary, layer_header, layers


def _csv(tables: Sequence[DomainMaskTables], error: str) -> str:
    """One line per cell, unrounded (accuracies, shares and IoU in percent; the ratio as it is)."""
    lines = []
    for t in tables:
        base = {"dataset": t.dataset, "algorithm": t.algorithm, "test_envs": ",".join(map(str, t.test_envs))}
        for name, columns, rows in (("summary", [*t.run_columns(), "mean"], t.summary),
                                    ("layers", t.layer_columns, t.layers)):
            for row in rows:
                for column, entry in zip(columns, row.entries):
                    line = {**base, "table": name, "row": row.label, "column": column}
                    if isinstance(entry, str):
                        lines.append({**line, "text": entry})
                        continue
                    scale = 100 if entry.percent else 1
                    values = ([entry.values[columns.index(column)]] if name == "summary" and column != "mean"
                              else entry.present())
                    values = [v for v in values if not math.isnan(v)]
                    cell = Cell(values=values, percent=entry.percent)
                    lines.append({**line, "mean": scale * cell.mean if values else None,
                                  "error": scale * cell.spread(error) if cell.shows_error() else None,
                                  "n": len(values)})
                if row.paper:
                    scale = 100 if QUANTITIES[row.paper.quantity] else 1
                    lines.append({**base, "table": name, "row": row.label, "column": "paper",
                                  "mean": None if math.isnan(row.paper.mean) else scale * row.paper.mean,
                                  "error": None if math.isnan(row.paper.error) else scale * row.paper.error,
                                  "text": row.paper.claim, "source": row.paper.source})
    columns = ["dataset", "algorithm", "test_envs", "table", "row", "column", "mean", "error", "n", "text", "source"]
    return pd.DataFrame(lines, columns=columns).to_csv(index=False)


def render(tables: Sequence[DomainMaskTables], fmt: str, error: str = "domainbed") -> str:
    """Markdown (per key a heading, the summary table, its notes and the per-layer table), LaTeX (a
    standalone document, the two tables per key with the notes under the first) or CSV (_csv)."""
    if fmt not in FORMATS:
        raise DomaingenError(f"collect domain-masks prints {', '.join(FORMATS)}, not {fmt}")
    if fmt == "csv":
        return _csv(tables, error)
    out = io.StringIO()
    for t in tables:
        summary_header, summary, layer_header, layers = _text_rows(t, error)
        notes = _notes(t, error)
        layer_title = f"{t.dataset}, {t.algorithm}: per layer, input to output (mean ± error over trials)"
        if fmt == "markdown":
            out.write(f"### {t.title}\n\n")
            out.write(tabulate(summary, headers=summary_header, tablefmt="github", disable_numparse=True) + "\n\n")
            out.write("".join(f"{line}\n" for line in notes) + "\n")
            out.write(f"#### {layer_title}\n\n")
            out.write(tabulate(layers, headers=layer_header, tablefmt="github", disable_numparse=True) + "\n\n")
        else:
            out.write(latex_text_table(t.title, summary_header, summary, notes))
            out.write(latex_text_table(layer_title, layer_header, layers, []))
    text = out.getvalue()
    return latex_document(text) if fmt == "latex" else text.rstrip("\n") + "\n"
