"""Turn selected results into tables: Markdown, LaTeX (booktabs), CSV.

A cell is the mean over trials of the selected test accuracies, in percent, ±
an error bar over trials: by default DomainBed's, ``std(x / sqrt(n))`` with
ddof 0 (``--error domainbed``); ``se`` is the sample standard error (ddof 1) and
``std`` the sample standard deviation. An Avg column is the mean of the column
means, without an error bar (as DomainBed prints it). A missing cell says what is
missing. Every caption names the data source of the runs; a table has a column
per test environment the sweep held out, and published numbers (collect
--reference) come as extra rows labelled with their source.

Every format states once what ± is and over how many trials (`error_note`): the
Markdown footer, a note under each LaTeX table (a table pasted into a paper keeps
it), the CSV's `error_definition` column and the HTML report. A cell some trial of
which selected the step-0 checkpoint (after one update) carries a dagger, one some trial of which had
every candidate validate the same a double dagger (selection.select's `step` and
`tied`), with a footnote under its table (`MARKS`) and the count in the CSV's
`step0_trials` and `tied_trials`: DomainBed's rule chose that checkpoint, so the
cell is DomainBed's, but it measures no learned choice.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
from tabulate import tabulate

from domaingen.tables.collect import (COMBINED_DIR, Collection, RunGrid, adapted_algorithms, data_sources, n_environments,
                                      table_records)
from domaingen.datasets import DATASETS
from domaingen.tables.provenance import mixed_versions_note
from domaingen.run.protocol import PROTOCOL_NOTES
from domaingen.tables.reference import reference_rows
from domaingen.tables.selection import (
    HPARAMS_CHOICE_TITLES,
    check_hparams_choice,
    has_in_domain_test,
    runs_with_in_domain_test,
    select,
    selection_method,
)
from domaingen.tables.wilds_selection import WILDS_PREFIX, wilds_metric_columns, wilds_select

ERROR_TITLES = {
    "domainbed": "± = DomainBed's error bar over the n trials of a cell, std(x / sqrt(n)) with ddof 0 "
                 "(the sample standard error times sqrt((n - 1) / n))",
    "se": "± = sample standard error over the n trials of a cell, std(x) / sqrt(n) with ddof 1",
    "std": "± = sample standard deviation over the n trials of a cell (ddof 1)",
}
STEP0, TIED = "†", "‡"
MARKS = {
    STEP0: "in at least one trial selection chose step 0, the checkpoint after the first update (DomainBed "
           "records it after one step): a network hardly trained, nearly the same for every algorithm with the same "
           "draw and trial. DomainBed's rule chooses it too; the CSV's steps column gives each trial's step",
    TIED: "in at least one trial every candidate checkpoint had the same validation accuracy: nothing was "
          "compared, DomainBed's tie-break chose (earliest step, then the largest hparams_seed)",
}
LATEX_MARKS = {STEP0: r"$^\dagger$", TIED: r"$^\ddagger$"}


@dataclass
class Cell:
    """One table cell: the trials' accuracies (with the runs selected for them), or why there are none.

    `trace` holds, parallel to `values`, one dict per trial (trial_seed, hparams_seed,
    step, run). An Avg cell holds the column means it averages and has no error bar
    (`error_bar=False`). `missing_runs` counts the runs of the sweep's grid that the
    cell needed and that are not done (failed, unfinished or absent).
    """

    values: list[float] = field(default_factory=list)
    missing: str = ""
    trace: list[dict] = field(default_factory=list)
    error_bar: bool = True
    missing_runs: int = 0
    note: str = ""
    percent: bool = True  # accuracies print as percentages (x100, one decimal); other quantities as they are
    marks: str = ""  # STEP0 and/or TIED (MARKS): how selection chose in some trial
    footnote: str = ""  # a caveat Markdown and LaTeX print as a numbered note under the table (cell_notes)
    test: str = ""  # a paired test of the values against 0 (statistics.paired_test): "wilcoxon" or "t"
    p_value: float = math.nan  # its p-value, and adjusted by Holm's method over the table's tests
    p_holm: float = math.nan

    def mark_counts(self) -> tuple[int, int]:
        """(trials whose selected checkpoint is step 0, trials whose candidates all tied)."""
        return (sum(t.get("step") == 0 for t in self.trace), sum(bool(t.get("tied")) for t in self.trace))

    def number_texts(self, error: str = "domainbed") -> tuple[str, str]:
        """The mean and the ± as printed ("" for no ±): x100 with one decimal; 3 significant digits, or
        whole numbers from 1000 to a million (a step, a count: 4325, not 4.33e+03)."""
        spread = self.spread(error) if self.shows_error() else math.nan
        if spread < 1e-9 * abs(self.mean):  # equal values' float noise (1 ± 5.6e-17) is no spread
            spread = 0.0
        if self.percent:
            return f"{100 * self.mean:.1f}", "" if math.isnan(spread) else f"{100 * spread:.1f}"
        if 1e3 <= abs(self.mean) < 1e6:
            return f"{self.mean:.0f}", "" if math.isnan(spread) else f"{spread:.0f}"
        return f"{self.mean:.3g}", "" if math.isnan(spread) else f"{spread:.2g}"

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else math.nan

    @property
    def domainbed_se(self) -> float:
        """DomainBed's error bar: np.std(values / sqrt(n)), ddof 0 (0.0 for one trial)."""
        if not self.values:
            return math.nan
        return float(np.std(np.asarray(self.values, dtype=float) / np.sqrt(len(self.values))))

    @property
    def se(self) -> float:
        """Sample standard error over trials: std with ddof 1, over sqrt(n)."""
        if len(self.values) < 2:
            return math.nan
        return float(np.std(self.values, ddof=1) / math.sqrt(len(self.values)))

    @property
    def std(self) -> float:
        """Sample standard deviation over trials (what the IRM paper's ± reports)."""
        return float(np.std(self.values, ddof=1)) if len(self.values) > 1 else math.nan

    def spread(self, error: str = "domainbed") -> float:
        """The ± of a cell: "domainbed" (the default), "se" or "std"; NaN for an Avg cell."""
        if not self.error_bar:
            return math.nan
        if error == "std":
            return self.std
        return self.se if error == "se" else self.domainbed_se

    def shows_error(self) -> bool:
        return self.error_bar and self.n > 1

    def test_text(self) -> str:
        """', p=0.031* (W)': the Holm-adjusted p of the cell's paired test, * below 0.05, W for Wilcoxon's
        signed-rank test and t for the paired t-test ('' without a test)."""
        if not self.test:
            return ""
        star = "*" if self.p_holm < 0.05 else ""
        return f", p={self.p_holm:.2g}{star} ({'W' if self.test == 'wilcoxon' else 't'})"

    def text(self, show_n: bool = False, error: str = "domainbed") -> str:
        if not self.values:
            return f"missing: {self.missing}" if self.missing else "missing"
        mean, spread = self.number_texts(error)
        body = mean + (f" ± {spread}" if spread else "") + self.test_text()
        body += f" (n={self.n})" if show_n and self.error_bar else ""
        return body + (f" {self.marks}" if self.marks else "")


@dataclass
class ReferenceCell:
    """A published number: its mean and its ± (fractions), and both as the source prints them."""

    mean: float = math.nan
    error: float = math.nan
    mean_text: str = ""
    error_text: str = ""

    @property
    def published(self) -> bool:
        return not math.isnan(self.mean)

    def text(self, plus_minus: str = "±") -> str:
        """The digits the source prints ("-" for none)."""
        if not self.published:
            return "-"
        mean = self.mean_text or f"{100 * self.mean:.1f}"
        error = self.error_text or ("" if math.isnan(self.error) else f"{100 * self.error:.1f}")
        return mean + (f" {plus_minus} {error}" if error else "")


@dataclass
class Table:
    """A titled grid of cells with row and column labels, and rows of published numbers below."""

    title: str
    key: str  # short machine name: dataset/selection/kind
    columns: list[str]
    rows: dict[str, list[Cell]]
    data_source: str = ""
    hparams_choice: str = "per_trial"
    references: dict[tuple[str, str], list[ReferenceCell]] = field(default_factory=dict)  # (algorithm, source)
    protocol: str = ""  # the experiment its runs followed (domaingen.run.protocol)

    def caption(self) -> str:
        notes = [f"data: {self.data_source}"] * bool(self.data_source) + [f"protocol: {self.protocol}"] * bool(self.protocol)
        return f"{self.title} ({'; '.join(notes)})" if notes else self.title


_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def row_order(name: str) -> tuple:
    """Sort key of a row name: its numbers compared as numbers, the rest as text, so that a grid's
    rows read in order of their values ('x=1e-05' before 'x=0.0001', 'lr 2' before 'lr 10')."""
    parts = _NUMBER.split(name)
    return tuple(float(p) if i % 2 else p for i, p in enumerate(parts)), name


def environment_names(dataset: str, n_envs: int) -> list[str]:
    if dataset in DATASETS and len(DATASETS.get(dataset).ENVIRONMENTS) == n_envs:
        return list(DATASETS.get(dataset).ENVIRONMENTS)
    return [f"env{i}" for i in range(n_envs)]


def held_out_environments(collection: Collection, dataset: str) -> list[int]:
    """The single test environments the sweep held out for `dataset`: those of any run found
    (done, failed or unfinished), so a column exists even when all its runs failed."""
    envs: set[int] = set()
    for frame in (collection.records, collection.runs):
        if frame.empty or "test_envs" not in frame:
            continue
        mine = frame[frame["dataset"] == dataset]
        envs |= {int(e[0]) for e in mine["test_envs"] if len(e) == 1}
    return sorted(envs)


def average_label(names: Sequence[str], envs: Sequence[int]) -> str | None:
    """The Avg column's header: "Avg" over every environment, "Avg (a, b)" over a subset,
    None (no column) when fewer than two environments were held out."""
    if len(envs) < 2:
        return None
    if len(envs) == len(names):
        return "Avg"
    return "Avg (" + ", ".join(names[e] for e in envs) + ")"


def source_label(records: pd.DataFrame, dataset: str | None = None) -> str:
    """The data source(s) of `dataset`'s records (of all records when None), for a caption."""
    mine = records if dataset is None else records[records["dataset"] == dataset]
    sources = data_sources(mine)
    label = " + ".join(sources) + (" (mixed)" if len(sources) > 1 else "")
    backbones = sorted(mine["backbone"].dropna().astype(str).unique()) if "backbone" in mine else []
    if backbones:  # which network and BatchNorm rule the runs used: tables of two protocols never look alike
        label += "; backbone " + " + ".join(backbones) + (" (mixed)" if len(backbones) > 1 else "")
    return label


def _missing_reason(collection: Collection, dataset: str, algorithm: str, env: int, method: str) -> str:
    runs = collection.runs
    if runs.empty:
        return "no runs"
    mine = runs[(runs["dataset"] == dataset) & (runs["algorithm"] == algorithm)]
    singles = mine[mine["test_envs"].map(lambda e: tuple(e) == (env,))]
    counts = singles["state"].value_counts().to_dict()
    parts = [f"{counts[s]} {s}" for s in ("failed", "incomplete", "not launched") if counts.get(s)]
    if not counts.get("done"):
        return f"no done run with test env {env}" + (f" ({', '.join(parts)})" if parts else "")
    if selection_method(method).pairs:
        return f"pair runs holding out {{{env}, v}} for every other v"
    return "no usable checkpoint"


def _held_out_accuracy_missing(records: pd.DataFrame) -> bool:
    """True when no record has an accuracy on any of its test environments (e.g. known-domain rows)."""
    return not any(
        pd.notna(row.get(f"env{t}_in_acc")) for row in records.to_dict("records") for t in row["test_envs"]
    )


def _average_cell(cells: Sequence[Cell]) -> Cell:
    """Avg column (DomainBed's): the mean of the column means, no error bar; missing if a column is."""
    if not cells or any(not c.values for c in cells):
        missing = [c for c in cells if not c.values]
        return Cell(missing=f"{len(missing)} environment(s) missing")
    return Cell([c.mean for c in cells], error_bar=False, note=f"mean of {len(cells)} column means")


def _trace(chosen: pd.DataFrame) -> list[dict]:
    tied = chosen["tied"] if "tied" in chosen else pd.Series(False, index=chosen.index)
    return [
        {"trial_seed": int(r.trial_seed), "hparams_seed": int(r.hparams_seed), "step": int(r.step), "run": str(r.run),
         "tied": bool(t is True or t == 1)}
        for r, t in zip(chosen.itertuples(), tied)
    ]


def selection_marks(trace: Sequence[dict]) -> str:
    """STEP0 when some trial selected step 0, TIED when some trial's candidates all tied (MARKS)."""
    return (STEP0 if any(t.get("step") == 0 for t in trace) else "") + (TIED if any(t.get("tied") for t in trace) else "")


def _selected_cells(chosen: pd.DataFrame, missing_runs: int) -> tuple[Cell, Cell]:
    """The test and in-domain cells of one (dataset, algorithm, test env), trials in trial_seed order."""
    ordered = chosen.sort_values("trial_seed", kind="stable")
    trace = _trace(ordered)
    marks = selection_marks(trace)
    return (
        Cell(ordered["test_acc"].astype(float).tolist(), trace=trace, missing_runs=missing_runs, marks=marks),
        Cell(ordered["indomain_acc"].astype(float).tolist(), trace=trace, missing_runs=missing_runs, marks=marks),
    )


def in_domain_split_label(records: pd.DataFrame, method: str) -> str:
    """Which split the in-domain numbers of `records` come from, for the table's caption."""
    own = ("training envs' in (training) splits" if selection_method(method).in_domain_split == "in"
           else "training envs' out splits: the selection split")
    if not has_in_domain_test(records):
        return own
    with_test = pd.Series(runs_with_in_domain_test(records), index=records.index)
    fractions = sorted({float(f) for f in records.loc[with_test, "in_domain_test"] if pd.notna(f)}) \
        if "in_domain_test" in records else []
    shown = "/".join(f"{f:g}" for f in fractions)
    label = f"training envs' in-domain test splits{' (' + shown + ' of each)' if shown else ''}, seen by no training or selection"
    if with_test.all():
        return label
    return f"{label} where runs have one, else {own}"


def _title_suffix(hparams_choice: str) -> str:
    # the default (DomainBed's) rule goes unnamed; any other is named where the table is
    return "" if hparams_choice == "per_trial" else f", {HPARAMS_CHOICE_TITLES[hparams_choice]}"


def adapted_note(records: pd.DataFrame) -> str:
    """The caption's mark of adapted rows ('' when the records have none)."""
    if not adapted_algorithms(records):
        return ""
    return ("; rows X+ADAPTER: X's selected weights adapted at test time to each unlabeled split (the T3A fork's "
            "protocol), the adapter's hyperparameters selected as draws by the same rule")


def combined_note(records: pd.DataFrame, method: str) -> str:
    """The caption's mark of rows that `domaingen average` combined ('' when the records have none):
    DiWA's and ENS's members are the checkpoints training-domain validation chose, whatever `method`,
    a soup's the last ones."""
    if "run" not in records or not records["run"].astype(str).str.startswith(f"{COMBINED_DIR}/").any():
        return ""
    rule = "as this table's rule does" if method == "training" else "not this table's rule"
    return ("; rows X (DiWA-uniform), X (DiWA-greedy), X (ENS): each trial's runs combined by domaingen average "
            f"from the checkpoints training-domain validation chose ({rule}), X (soup) from their last ones")


def dataset_tables(
    collection: Collection, method: str, hparams_choice: str = "per_trial"
) -> tuple[list[Table], list[Table]]:
    """Per dataset: the test-accuracy table and the in-domain (training envs' out split) table.

    Columns are the environments the sweep held out (held_out_environments), then Avg
    where it is defined (average_label). Test-time modes become rows of their own
    (collect.table_records: modes and test-time adaptation); a mode with no test accuracy anywhere (known-domain:
    undefined on a held-out domain) has a row in the in-domain table only. A dataset
    without single-environment runs (WILDS' official splits) has no table here.
    """
    records = table_records(collection)
    bases = records.groupby("algorithm")["base_algorithm"].first().dropna().to_dict() if "base_algorithm" in records else {}
    entry = selection_method(method)
    selected = select(records, method, hparams_choice)
    # one pass over the (large) frames instead of a boolean mask per cell
    by_algorithm = dict(tuple(records.groupby(["dataset", "algorithm"], sort=True)))
    by_cell = dict(tuple(selected.groupby(["dataset", "algorithm", "test_env"], sort=False))) if not selected.empty else {}
    grid = RunGrid(collection.runs)
    test_tables, indomain_tables = [], []
    for dataset in sorted(records["dataset"].unique()):
        envs = held_out_environments(collection, dataset)
        if not envs:
            continue
        n_envs = n_environments(records, dataset)
        names = environment_names(dataset, max(n_envs, envs[-1] + 1))
        avg = average_label(names, envs)
        columns = [names[e] for e in envs] + ([avg] if avg else [])
        test_rows, in_rows = {}, {}
        for algorithm in sorted((a for d, a in by_algorithm if d == dataset), key=row_order):
            mine = by_algorithm[(dataset, algorithm)]
            # a method that validates on held-out domains (oracle, leave-one-domain-out) has nothing to validate
            undefined = algorithm in bases and entry.held_out_validation and _held_out_accuracy_missing(mine)
            test_cells, in_cells = [], []
            test_defined = False
            for env in envs:
                chosen = by_cell.get((dataset, algorithm, env), selected.iloc[:0])
                missing_runs = grid.missing(dataset, bases.get(algorithm, algorithm), env,
                                             pairs=entry.pairs)
                if len(chosen):
                    test_defined |= bool(chosen["test_acc"].notna().any())
                    test_cell, in_cell = _selected_cells(chosen, missing_runs)
                    test_cells.append(test_cell)
                    in_cells.append(in_cell)
                else:
                    reason = (
                        "undefined: validated on held-out domains"
                        if undefined
                        else _missing_reason(collection, dataset, bases.get(algorithm, algorithm), env, method)
                    )
                    test_cells.append(Cell(missing=reason, missing_runs=missing_runs))
                    in_cells.append(Cell(missing=reason, missing_runs=missing_runs))
            average = [_average_cell(test_cells)] if avg else []
            if test_defined or algorithm not in bases:
                test_rows[algorithm] = test_cells + average
            in_rows[algorithm] = in_cells + ([_average_cell(in_cells)] if avg else [])
        of_dataset = records[records["dataset"] == dataset]
        title = (entry.description + _title_suffix(hparams_choice) + adapted_note(of_dataset)
                 + combined_note(of_dataset, method))
        source = source_label(records, dataset)
        test_tables.append(Table(f"{dataset}: test accuracy, {title}", f"{dataset}/{method}/test", columns, test_rows,
                                 data_source=source, hparams_choice=hparams_choice))
        which = in_domain_split_label(records[records["dataset"] == dataset], method)
        indomain_tables.append(
            Table(f"{dataset}: in-domain accuracy ({which}), {title}", f"{dataset}/{method}/indomain",
                  columns, in_rows, data_source=source, hparams_choice=hparams_choice)
        )
    return test_tables, indomain_tables


def _per_trial_average(cells: Sequence[Cell]) -> Cell:
    """A dataset's cell in the averages table, as DomainBed computes it.

    Per trial_seed, the mean of that trial's selected test accuracies over the
    environments it has; the cell is the mean ± error over those per-trial means.
    """
    by_trial: dict[int, list[float]] = {}
    for cell in cells:
        for value, trace in zip(cell.values, cell.trace):
            by_trial.setdefault(trace["trial_seed"], []).append(value)
    if not by_trial:
        return Cell(missing="no environment has a result")
    seeds = sorted(by_trial)
    partial = sum(len(by_trial[s]) < len(cells) for s in seeds)
    note = f"{partial} trial(s) averaged over fewer than {len(cells)} environments" if partial else ""
    marks = "".join(m for m in MARKS if any(m in c.marks for c in cells))  # it rests on those cells' selections
    # DomainBed's number, but a reader of the table must see that it does not cover every environment
    footnote = (f"{partial} of {len(seeds)} trial(s) averaged over the environments they have, fewer than "
                f"{len(cells)} (as DomainBed's collect_results averages)") if partial else ""
    return Cell([float(np.mean(by_trial[s])) for s in seeds], trace=[{"trial_seed": s} for s in seeds], note=note,
                marks=marks, footnote=footnote)


def averages_table(test_tables: Sequence[Table], method: str) -> Table | None:
    """Rows: algorithms; columns: each dataset's per-trial average (DomainBed's), then their mean.

    Only datasets whose table has an Avg column take part (a column header names the
    environments a subset Avg covers); None when fewer than two datasets have one. A dataset's cell
    averages, per trial, that trial's selected test accuracies over the table's
    environment columns, then gives mean ± error over trials; the last column is the
    mean of the dataset cells, without an error bar.
    """
    with_avg = [t for t in test_tables if t.columns and t.columns[-1].startswith("Avg")]
    if len(with_avg) < 2:  # one dataset: the table would repeat that dataset's Avg column
        return None
    datasets = [t.key.split("/")[0] for t in with_avg]
    columns = [d if t.columns[-1] == "Avg" else f"{d} {t.columns[-1]}" for d, t in zip(datasets, with_avg)]
    algorithms = sorted({a for t in with_avg for a in t.rows}, key=row_order)
    choice = with_avg[0].hparams_choice
    rows = {}
    for algorithm in algorithms:
        cells = [_per_trial_average(t.rows[algorithm][:-1]) if algorithm in t.rows else Cell(missing="not run")
                 for t in with_avg]
        overall = _average_cell(cells)
        # an Avg over a partial dataset average carries the same caveat (the same numbered note)
        overall.footnote = next((c.footnote for c in cells if c.footnote), "") if overall.values else ""
        rows[algorithm] = cells + [overall if overall.values else Cell(missing="a dataset is missing")]
    sources = sorted({t.data_source for t in with_avg})
    source = sources[0] if len(sources) == 1 else "; ".join(f"{d}: {t.data_source}" for d, t in zip(datasets, with_avg))
    title = f"Averages over datasets, {selection_method(method).description}{_title_suffix(choice)}"
    return Table(title, f"all/{method}/averages", columns + ["Avg"], rows, data_source=source, hparams_choice=choice)


def wilds_tables(collection: Collection) -> list[Table]:
    """Per dataset with WILDS' own metrics in its records (the *Official datasets): those metrics
    of the OOD test split, selected per trial on the OOD validation split (wilds_selection)."""
    records = collection.records
    if not any(c.startswith(WILDS_PREFIX) for c in records.columns):
        return []
    tables = []
    chosen = wilds_select(records)
    for dataset in sorted(chosen["dataset"].unique()):
        mine = chosen[chosen["dataset"] == dataset]
        metrics = wilds_metric_columns(records, dataset)
        rows = {}
        for algorithm, sub in mine.groupby("algorithm", sort=True):
            ordered = sub.sort_values("trial_seed")
            rows[algorithm] = [Cell(ordered[m].astype(float).tolist()) if ordered[m].notna().any()
                               else Cell(missing="not recorded") for m in metrics]
        val_metric = mine["selected_on"].iloc[0]
        title = f"{dataset}: WILDS' metrics of the OOD test split, selected per trial on {val_metric.removeprefix(WILDS_PREFIX)}"
        columns = [m.removeprefix(WILDS_PREFIX).replace("_", " ", 1) for m in metrics]
        tables.append(Table(title, f"{dataset}/wilds/wilds", columns, rows, data_source=source_label(records, dataset)))
    return tables


def build_tables(
    collection: Collection,
    methods: Sequence[str],
    hparams_choice: str = "per_trial",
    reference: pd.DataFrame | None = None,
) -> list[Table]:
    """Every table for the given selection methods, in reading order, then WILDS' metrics tables.

    `reference` (domaingen.tables.reference.read_reference) adds published rows to the tables they match.
    """
    check_hparams_choice(hparams_choice)
    tables: list[Table] = []
    for method in methods:
        test_tables, indomain_tables = dataset_tables(collection, method, hparams_choice)
        tables += test_tables
        averages = averages_table(test_tables, method)
        tables += [averages] if averages is not None else []
        tables += indomain_tables
    tables += wilds_tables(collection)
    for table in tables:
        table.protocol = collection.protocol
    if reference is not None:
        for table in tables:
            add_reference_rows(table, reference)
    return tables


def add_reference_rows(table: Table, reference: pd.DataFrame) -> None:
    """Published rows for `table`: same dataset, table kind and selection method (or none named).

    A published cell fills the column of its environment (or the Avg column, when that
    averages every environment); a row with no cell in this table is left out.
    """
    dataset, method, kind = table.key.split("/")
    for (algorithm, source), cells in reference_rows(reference, dataset, method, kind).items():
        row = [ReferenceCell(*cells[c]) if c in cells else ReferenceCell() for c in table.columns]
        if any(cell.published for cell in row):
            table.references[(algorithm, source)] = row


# ---- formats -----------------------------------------------------------------


def _cell_note(cell: Cell) -> str:
    """What a numbered note says of `cell`: why it is missing, or its caveat ('' for neither)."""
    return cell.missing if not cell.values else cell.footnote


def cell_notes(table: Table) -> dict[str, int]:
    """Each distinct reason that a cell of `table` is missing, and each cell's caveat (`Cell.footnote`),
    numbered in reading order (row by row).

    Markdown and LaTeX print a missing cell as `missing [k]`, a cell with a caveat as its number
    followed by `[k]`, and the notes under the table, so that a partly run sweep's table stays
    as narrow as a finished one.
    """
    notes: dict[str, int] = {}
    for cells in table.rows.values():
        for cell in cells:
            text = _cell_note(cell)
            if text and text not in notes:
                notes[text] = len(notes) + 1
    return notes


def _note_number(cell: Cell, notes: dict[str, int]) -> str:
    """' [k]', the number of the cell's note in `notes` (cell_notes); '' when it has none."""
    text = _cell_note(cell)
    return f" [{notes[text]}]" if text in notes else ""


def short_cell_text(cell: Cell, notes: dict[str, int], show_n: bool = False, error: str = "domainbed") -> str:
    """`cell.text()`, with a missing cell's reason replaced by its number in `notes` (cell_notes) and
    a caveat's number appended."""
    number = _note_number(cell, notes)
    if not number:
        return cell.text(show_n, error)
    return f"missing{number}" if not cell.values else f"{cell.text(show_n, error)}{number}"


def note_lines(notes: dict[str, int]) -> list[str]:
    """'[k] note.' for each numbered note, in order."""
    return [f"[{k}] {text}." for text, k in notes.items()]


def to_markdown(tables: Sequence[Table], collection: Collection, show_n: bool = False, error: str = "domainbed") -> str:
    out = io.StringIO()
    for table in tables:
        out.write(f"### {table.caption()}\n\n")
        notes = cell_notes(table)
        body = [[alg] + [short_cell_text(c, notes, show_n, error) for c in cells] for alg, cells in table.rows.items()]
        body += [[f"{alg} ({source})"] + [c.text() for c in cells] for (alg, source), cells in table.references.items()]
        out.write(tabulate(body, headers=["Algorithm"] + table.columns, tablefmt="github", disable_numparse=True))
        out.write("\n\n")
        footnotes = [f"{mark} {text}." for mark, text in table_marks(table)] + note_lines(notes)
        out.write("".join(f"{line}\n" for line in footnotes))
        out.write("\n" if footnotes else "")
        note = mixed_versions_note(collection, table.key.split("/")[0])
        out.write(f"{note}\n\n" if note else "")
    out.write(error_note(error, tables, protocol=collection.protocol) + "\n")
    out.write(_footer(collection))
    return out.getvalue()


def table_marks(table: Table) -> list[tuple[str, str]]:
    """(mark, footnote) for each of MARKS that some cell of `table` carries, in MARKS' order."""
    used = "".join(c.marks for cells in table.rows.values() for c in cells)
    return [(mark, text) for mark, text in MARKS.items() if mark in used]


def trial_counts(tables: Sequence[Table]) -> str:
    """How many trials the cells with an error bar have: "n = 3 trials per cell", or a range."""
    counts = sorted({c.n for t in tables for cells in t.rows.values() for c in cells if c.values and c.error_bar})
    if not counts:
        return "no cell has a trial"
    if len(counts) == 1:
        n = counts[0]
        return f"n = {n} trial{'' if n == 1 else 's'} per cell" + (" (no ±)" if n == 1 else "")
    return f"n = {counts[0]} to {counts[-1]} trials per cell (--show_trials prints each cell's n)"


def error_note(error: str, tables: Sequence[Table] = (), averages: bool = True, protocol: str | None = None) -> str:
    """One line saying what a cell's ± is, over how many trials, (`averages`) what Avg columns are
    and, given `protocol`, what its trials share."""
    trials = f"; {trial_counts(tables)}" if tables else ""
    note = ERROR_TITLES[error] + trials + ("; Avg columns: the mean of the column means, without ±." if averages else "")
    if protocol not in PROTOCOL_NOTES:
        return note
    text = PROTOCOL_NOTES[protocol]
    return f"{note} {text[0].upper()}{text[1:]}."


def done_runs(count: int) -> str:
    """'1 done run' / 'N done runs'."""
    return f"{count} done run{'' if count == 1 else 's'}"


def skipped_lines(collection: Collection) -> list[str]:
    """What the tables were built without: how many records of done runs were skipped, and where."""
    if not collection.skipped:
        return []
    count = sum(n for _, n, _ in collection.skipped)
    where = "; ".join(f"{path}: {what}" for path, _, what in collection.skipped)
    return [f"Built from fewer records than the runs hold: {count} skipped ({where})."]


def _footer(collection: Collection) -> str:
    lines = [f"{done_runs(collection.records['run'].nunique())}, {len(collection.records)} records."]
    lines += skipped_lines(collection)
    if collection.bundle:
        held = (", and the weights of the runs its tables selected" if collection.bundle.get("weights", True)
                else " (no weights)")
        lines.append(f"Read from a bundle of sweep {collection.bundle.get('source')}: the records of its "
                     f"{done_runs(collection.bundle.get('done_runs', 0))}{held}.")
    if collection.failed:
        lines.append(f"Failed runs ({len(collection.failed)}), not counted:")
        lines += [f"- {run}: {reason}" for run, reason in collection.failed]
    if collection.incomplete:
        lines.append(f"Incomplete runs ({len(collection.incomplete)}), not counted.")
    return "\n".join(lines) + "\n"


LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                 "\u2212": r"$-$",  # the minus of collect --paired's row labels; pdflatex has no glyph for it
                 "±": r"$\pm$", **LATEX_MARKS}


def _is_minus(text: str, i: int) -> bool:
    """A hyphen that is a minus sign: before a digit, not inside a word or a number ("-90%", not "ERM-2")."""
    return (text[i] == "-" and i + 1 < len(text) and text[i + 1].isdigit()
            and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] in "._")))


def latex_escape(text: str) -> str:
    """`text` for LaTeX's text mode: special characters escaped, a leading minus as $-$."""
    return "".join("$-$" if _is_minus(text, i) else LATEX_ESCAPES.get(ch, ch) for i, ch in enumerate(text))


def latex_text_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str]) -> str:
    """One booktabs table of plain-text cells (escaped here): a caption, the first column left-aligned and
    the others centred, scaled down to the line width when wider, and `notes` under it."""
    head = " & ".join(latex_escape(c) for c in header) + r" \\"
    body = [" & ".join(latex_escape(str(v)) for v in row) + r" \\" for row in rows]
    return "\n".join([r"\begin{table}[ht]", r"\centering", r"\caption{" + latex_escape(title) + "}",
                      r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%",
                      r"\begin{tabular}{l" + "c" * (len(header) - 1) + "}", r"\toprule", head,
                      r"\midrule", *body, r"\bottomrule", r"\end{tabular}}",
                      r"\par\smallskip{\footnotesize\raggedright",
                      "\\par\n".join(latex_escape(n) for n in notes), r"\par}", r"\end{table}", ""])


def latex_document(body: str) -> str:
    """A standalone article around `body` with the packages latex_text_table needs."""
    return "\n".join([r"\documentclass{article}", r"\usepackage[margin=2cm]{geometry}", r"\usepackage{booktabs}",
                      r"\usepackage{graphicx}", r"\begin{document}", body, r"\end{document}", ""])


def _latex_cell(cell: Cell, show_n: bool, error: str = "domainbed", notes: dict[str, int] | None = None,
                rank: str = "") -> str:
    """A cell's LaTeX; `rank` BEST sets its number in bold, SECOND underlines it (column_ranks)."""
    if not cell.values:
        return r"\textit{" + latex_escape(short_cell_text(cell, notes or {})) + "}"
    mean, spread = cell.number_texts(error)
    text = mean + (rf" $\pm$ {spread}" if spread else "")
    text = {BEST: r"\textbf{%s}", SECOND: r"\underline{%s}"}.get(rank, "%s") % text
    text += latex_escape(cell.test_text())
    text += f" ({cell.n})" if show_n and cell.error_bar else ""
    return text + "".join(LATEX_MARKS[m] for m in cell.marks) + _note_number(cell, notes or {})


BEST, SECOND = "best", "second"
# the kinds of table (the last part of Table.key) whose cells are accuracies to rank: higher is better
RANKED_KINDS = ("test", "indomain", "averages")
RANK_RULE = ("Bold: the best cell of each column, with every cell whose mean is within the larger of the two "
             "error bars of it (as printed; in Avg columns, equal means); underlined: the best of the others, "
             "likewise; published rows are not ranked")


def _tied(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Two printed (mean, ±) pairs no further apart than the larger ± (0 for a cell without one)."""
    return abs(a[0] - b[0]) <= max(a[1], b[1]) + 1e-9


def column_ranks(table: Table, error: str = "domainbed") -> dict[tuple[str, int], str]:
    """(row, column index) -> BEST or SECOND, for the accuracy tables DG papers mark (RANKED_KINDS).

    Per column, over the cells with a value: BEST is the highest printed mean and every cell tied with
    it (`_tied`: means within the larger of their printed error bars); SECOND the highest of the rest
    and those tied with it, given three cells or more (with two, underlining marks only the last).
    """
    if table.key.rsplit("/", 1)[-1] not in RANKED_KINDS:
        return {}
    ranks: dict[tuple[str, int], str] = {}
    for j in range(len(table.columns)):
        printed = {}
        for row, cells in table.rows.items():
            cell = cells[j]
            if cell.values and cell.percent:
                mean, spread = cell.number_texts(error)
                printed[row] = (float(mean), float(spread) if spread else 0.0)
        if len(printed) < 2:
            continue
        rest = dict(printed)
        for rank in (BEST, SECOND)[: 1 + (len(printed) >= 3)]:
            if not rest:
                break
            top = max(rest.values(), key=lambda pair: pair[0])
            tied = [row for row, pair in rest.items() if _tied(pair, top)]
            ranks.update({(row, j): rank for row in tied})
            rest = {row: pair for row, pair in rest.items() if row not in tied}
    return ranks


LATEX_PACKAGES = ("booktabs", "graphicx")
# about one column of a two-column paper at 10 pt (e.g. 241 pt in ACL, 240 pt in IEEEtran)
COLUMN_WIDTH_PT = 240.0
# a table whose natural width is within this factor of a column's stays `table`, shrunk to fit it (to 8 pt
# type at 10 pt, a DG paper's usual \small or \footnotesize table); a wider one is `table*`
MAX_SHRINK = 0.8
CHAR_PT, COLSEP_PT = 4.5, 12.0  # a character of 10 pt Computer Modern (digit 5, point and space 3); 2 x \tabcolsep


def _latex_reference_cell(cell: ReferenceCell) -> str:
    return cell.text(r"$\pm$") if cell.published else "--"


def _visible_length(latex: str) -> int:
    """Characters a LaTeX cell prints (commands and braces dropped; a plus-minus sign is one)."""
    text = latex.replace(r"$\pm$", "±").replace("$-$", "-")
    for command in (r"\textit{", r"\textbf{", r"\underline{"):
        text = text.replace(command, "")
    for mark in LATEX_MARKS.values():
        text = text.replace(mark, "+")
    for escaped in ("%", "&", "_", "#", "$"):
        text = text.replace("\\" + escaped, escaped)
    return len(text.replace("{", "").replace("}", ""))


def latex_width_pt(grid: Sequence[Sequence[str]]) -> float:
    """A rough natural width of a tabular with these LaTeX cells (rows of equal length), in points."""
    return sum(max(_visible_length(row[j]) for row in grid) * CHAR_PT + COLSEP_PT for j in range(len(grid[0])))


def latex_table(table: Table, show_n: bool = False, error: str = "domainbed", placement: str | None = None,
                note: str = "", long_caption: bool = True, document_note: Sequence[str] | None = None) -> str:
    """One table as a float: `table` when it fits one column of a two-column paper at MAX_SHRINK of
    its size or more, else `table*` (both columns); its type keeps the document's size and shrinks
    only when wider than the line.

    `placement` overrides the float's placement ([ht] for table, [t] for table*, which takes no h);
    `note`, a line set small under the table (e.g. that its runs mix code versions). The caption is
    `Table.caption()`, or with `long_caption` False the title alone. `document_note`, when given,
    replaces what the note under the table says of the error bar and the marks: to_latex gives the
    first table the document's note and the others none (their marks are explained there).
    """
    header = ["Algorithm"] + [latex_escape(c) for c in table.columns]
    notes = cell_notes(table)
    ranks = column_ranks(table, error)
    body = [[latex_escape(alg)] + [_latex_cell(c, show_n, error, notes, ranks.get((alg, j), ""))
                                   for j, c in enumerate(cells)]
            for alg, cells in table.rows.items()]
    published = [[latex_escape(f"{alg} ({source})")] + [_latex_reference_cell(c) for c in cells]
                 for (alg, source), cells in table.references.items()]
    wide = latex_width_pt([header] + body + published) * MAX_SHRINK > COLUMN_WIDTH_PT
    float_env, default_placement = ("table*", "[t]") if wide else ("table", "[ht]")
    placement = placement or default_placement
    lines = [
        rf"\begin{{{float_env}}}{placement}",
        r"\centering",
        r"\caption{" + latex_escape(table.caption() if long_caption else table.title) + "}",
        r"\label{tab:" + table.key.replace("/", "-").replace("_", "") + "}",
        r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%",
        r"\begin{tabular}{" + "l" + "c" * len(table.columns) + "}",
        r"\toprule",
        " & ".join(header) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(row) + r" \\" for row in body]
    if published:
        lines.append(r"\midrule")
        lines += [" & ".join(row) + r" \\" for row in published]
    lines += [r"\bottomrule", r"\end{tabular}}"]
    table_note = latex_table_note(table, error, document_note)
    lines += [table_note] if table_note else []
    if note:
        lines.append(r"\par\smallskip{\footnotesize " + latex_escape(note.replace("`", "")) + "}")
    lines += [rf"\end{{{float_env}}}", ""]
    return "\n".join(lines)


def latex_table_note(table: Table, error: str = "domainbed", document_note: Sequence[str] | None = None) -> str:
    """The note under a LaTeX table: what ± is over how many trials, what bold and underlined mean, its
    marks' footnotes, and why its missing cells are missing, so that the table keeps them when pasted
    into a paper. With `document_note` (plain-text paragraphs), that replaces the first three."""
    if document_note is None:
        parts = [error_note(error, [table])] + [RANK_RULE + "."] * bool(column_ranks(table, error))
        parts += [f"{mark} {text}." for mark, text in table_marks(table)]
    else:
        parts = list(document_note)
    parts += note_lines(cell_notes(table))
    if not parts:
        return ""
    text = "\\par\n".join(latex_escape(p) for p in parts)
    for plain, math_mode in LATEX_FORMULAS.items():
        text = text.replace(plain, math_mode)
    return "\n".join([r"\par\smallskip{\footnotesize\raggedright", text, r"\par}"])


def latex_document_note(tables: Sequence[Table], error: str = "domainbed", long_caption: bool = False) -> list[str]:
    """The note said once per document, under its first table: what ± is, over how many trials; the
    rule of bold and underlined cells; every mark used; and, with short captions, the data source and
    protocol when every table shares them."""
    parts = [error_note(error, tables)]
    if any(column_ranks(t, error) for t in tables):
        parts.append(RANK_RULE + ".")
    used = "".join(mark for t in tables for mark, _ in table_marks(t))
    parts += [f"{mark} {text}." for mark, text in MARKS.items() if mark in used]
    if not long_caption:
        shared = _shared_provenance(tables)
        parts += [shared] if shared else []
    return parts


def _shared_provenance(tables: Sequence[Table]) -> str:
    """'Data: X; protocol: Y.' when every table names the same ones ('' when they differ or none)."""
    sources = {t.data_source for t in tables}
    protocols = {t.protocol for t in tables}
    found = [f"data: {next(iter(sources))}"] * (len(sources) == 1 and "" not in sources)
    found += [f"protocol: {next(iter(protocols))}"] * (len(protocols) == 1 and "" not in protocols)
    text = "; ".join(found)
    return f"{text[0].upper()}{text[1:]}." if found else ""


def _short_caption_table(table: Table, tables: Sequence[Table]) -> Table:
    """`table` with its title extended by its data source and protocol where the document's tables differ
    in them (the document note names them once otherwise)."""
    import dataclasses

    extra = []
    if len({t.data_source for t in tables}) > 1 and table.data_source:
        extra.append(f"data: {table.data_source}")
    if len({t.protocol for t in tables}) > 1 and table.protocol:
        extra.append(f"protocol: {table.protocol}")
    return dataclasses.replace(table, title=f"{table.title} ({'; '.join(extra)})") if extra else table


# the error bars' formulas as LaTeX typesets them, in the note under a table
LATEX_FORMULAS = {"std(x / sqrt(n))": r"$\mathrm{std}(x/\sqrt{n})$", "std(x) / sqrt(n)": r"$\mathrm{std}(x)/\sqrt{n}$",
                  "sqrt((n - 1) / n)": r"$\sqrt{(n-1)/n}$", "the n trials": "the $n$ trials", "; n = ": "; $n$ = "}


def to_latex(
    tables: Sequence[Table], collection: Collection, show_n: bool = False, bare: bool = False, error: str = "domainbed",
    long_captions: bool = False,
) -> str:
    """A standalone document, or with `bare` the tables alone for \\input in a paper (the
    packages they need are named in a comment at the top).

    Captions are the tables' titles (`long_captions`: with the data source and protocol); what ±
    is, the rule of bold and underlined cells, the marks and (short captions) the data source are
    said once, under the first table; records skipped as unreadable are named in a comment."""
    if not long_captions:
        tables = [_short_caption_table(t, tables) for t in tables]
    shared = latex_document_note(tables, error, long_captions)
    placement = None if bare else "[!ht]"  # one column: both kinds of float read as `table`; they may stand here
    body = "\n".join(latex_table(t, show_n, error, placement, note=_note(collection, t), long_caption=long_captions,
                                 document_note=shared if i == 0 else ())
                     for i, t in enumerate(tables))
    comments = [f"% {line}" for line in skipped_lines(collection)]
    if bare:
        return "\n".join([
            r"% domaingen tables: \input this file; the preamble needs " + "".join(
                rf"\usepackage{{{p}}}" for p in LATEX_PACKAGES) + ".",
            r"% Tables keep the document's type size and shrink only when wider than their column;",
            r"% those wider than one column of a two-column paper are table* (they span both columns).",
            *comments,
            body,
        ])
    return "\n".join(
        [r"\documentclass{article}", r"\usepackage[margin=2cm]{geometry}"]
        + [rf"\usepackage{{{p}}}" for p in LATEX_PACKAGES]
        + comments + [r"\begin{document}", body, r"\end{document}", ""]
    )


def _note(collection: Collection, table: Table) -> str:
    return mixed_versions_note(collection, table.key.split("/")[0])


def _joined(cell: Cell, key: str) -> str:
    return ";".join(str(t[key]) for t in cell.trace if key in t)


def _csv_note(cell: Cell) -> str:
    """A filled cell's note, and in words what its marks say."""
    step0, tied = cell.mark_counts()
    parts = [cell.note] if cell.note else []
    parts += [f"step 0 selected in {step0} of {cell.n} trials"] if step0 else []
    parts += [f"every candidate tied in {tied} of {cell.n} trials"] if tied else []
    if cell.marks and not (step0 or tied):
        parts.append(f"averages cells marked {cell.marks}")
    return "; ".join(parts)


def to_csv(tables: Sequence[Table], error: str = "domainbed") -> str:
    """Long format: one line per cell, traceable to the runs behind it.

    Columns: mean and `error` (the chosen ±, named in `error_kind`; empty for Avg
    cells and single trials), `se`, `std`, `n` (trials; for an Avg cell, the columns
    averaged), `missing` (runs of the sweep's grid the cell needed that are not done),
    `note` (why a cell is empty, or what an average covers), per trial, `;`-joined
    in trial order: `trial_seeds`, `hparams_seeds`, `steps`, `runs` (the selected
    run directories) and `values` (each trial's number, unrounded), and `data_source`,
    the runs' data source; `protocol`, the experiment they followed; `marks` (MARKS' symbols, as the other formats print them),
    `step0_trials` and `tied_trials` (trials that selected step 0, trials whose
    candidates all tied; the `note` says it in words) and `error_definition` (what
    `error` is, the same words as the other formats). Rows of published
    numbers (collect --reference) name their `source`, with the ± they print in
    `published_error` (ours leave both empty). Cells of paired differences with a
    paired test add `test` (wilcoxon or t), `p_value` and `p_holm` (Holm-adjusted
    over their table's tests).
    """
    rows = []
    for table in tables:
        dataset, method, kind = table.key.split("/")
        base = {"selection": method, "hparams_choice": table.hparams_choice, "table": kind, "dataset": dataset}
        for alg, cells in table.rows.items():
            for column, cell in zip(table.columns, cells):
                rows.append(
                    {
                        **base,
                        "algorithm": alg,
                        "column": column,
                        "mean": cell.mean if cell.values else None,
                        "error": cell.spread(error) if cell.shows_error() else None,
                        "error_kind": error,
                        "se": cell.se if cell.shows_error() else None,
                        "std": cell.std if cell.shows_error() else None,
                        "n": cell.n,
                        "missing": cell.missing_runs,
                        "note": cell.missing if not cell.values else _csv_note(cell),
                        "marks": cell.marks,
                        "step0_trials": cell.mark_counts()[0],
                        "tied_trials": cell.mark_counts()[1],
                        "error_definition": ERROR_TITLES[error].removeprefix("± = "),
                        "trial_seeds": _joined(cell, "trial_seed"),
                        "hparams_seeds": _joined(cell, "hparams_seed"),
                        "steps": _joined(cell, "step"),
                        "runs": _joined(cell, "run"),
                        "values": ";".join(repr(float(v)) for v in cell.values),
                        "data_source": table.data_source,
                        "protocol": table.protocol,
                        "source": "",
                        "published_error": None,
                        **({"test": cell.test, "p_value": cell.p_value, "p_holm": cell.p_holm} if cell.test else {}),
                    }
                )
        for (alg, source), cells in table.references.items():
            for column, cell in zip(table.columns, cells):
                if cell.published:
                    rows.append({**base, "algorithm": alg, "column": column, "mean": cell.mean, "n": None,
                                 "missing": None, "source": source,
                                 "published_error": None if math.isnan(cell.error) else cell.error})
    return pd.DataFrame(rows).to_csv(index=False)
