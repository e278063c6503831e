"""Algorithms compared over datasets: `collect ranks` and `collect intervals`.

A dataset's score of an algorithm is, per trial, the mean of that trial's selected test
accuracies over the dataset's held-out environments (DomainBed's per-trial average, as in the
averages table); its score for ranking is the mean of those over trials.

- `ranks`: per selection method, each dataset ranks the algorithms (1 = best, ties averaged);
  the average ranks, Friedman's test of them, Iman and Davenport's F and the Nemenyi critical
  difference (Demšar 2006; tables.statistics.friedman_nemenyi).
- `intervals`: per selection method and algorithm, the mean and the interquartile mean of all
  runs' scores (a run: one trial of one dataset), with stratified bootstrap percentile intervals
  whose strata are the datasets (rliable, Agarwal et al. 2021; tables.statistics.stratified_bootstrap).

Only algorithms with a score on every dataset take part; the note under a table names those left out.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd
from tabulate import tabulate

from domaingen.errors import DomaingenError
from domaingen.tables.reporting import Table, _per_trial_average, latex_document, latex_text_table
from domaingen.tables.selection import selection_method
from domaingen.tables.statistics import AGGREGATES, Friedman, friedman_nemenyi, stratified_bootstrap


@dataclass
class Summary:
    """One table of a view: a title, its rows (a frame whose index is the algorithm), lines said under it,
    and for `ranks` the Friedman result the critical-difference diagram draws."""

    title: str
    key: str  # selection method
    frame: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    friedman: Friedman | None = None


def dataset_runs(tables: Sequence[Table], method: str) -> dict[str, dict[str, list[float]]]:
    """dataset -> algorithm -> per-trial scores (each trial's mean over the held-out environments) of
    `method`'s test tables; an algorithm without a score on a dataset is absent from its entry."""
    out: dict[str, dict[str, list[float]]] = {}
    for table in tables:
        dataset, key_method, kind = table.key.split("/")
        if kind != "test" or key_method != method or dataset == "all":
            continue
        envs = [j for j, c in enumerate(table.columns) if not c.startswith("Avg")]
        for algorithm, cells in table.rows.items():
            cell = _per_trial_average([cells[j] for j in envs])
            if cell.values:
                out.setdefault(dataset, {})[algorithm] = cell.values
    return out


def _complete(runs: dict[str, dict[str, list[float]]], view: str) -> tuple[list[str], list[str], list[str]]:
    """(datasets, algorithms every dataset has, algorithms left out); one line when fewer than two datasets."""
    datasets = sorted(runs)
    if len(datasets) < 2:
        raise DomaingenError(f"collect {view} compares algorithms over datasets and needs two or more; these runs have "
                             f"{len(datasets)}{': ' + datasets[0] if datasets else ''} (collect tables compares within one)")
    everywhere = sorted({a for by in runs.values() for a in by})
    complete = [a for a in everywhere if all(a in runs[d] for d in datasets)]
    return datasets, complete, [a for a in everywhere if a not in complete]


def _left_out_note(left_out: Sequence[str], datasets: Sequence[str]) -> list[str]:
    if not left_out:
        return []
    return [f"Left out, without a result on every dataset ({', '.join(datasets)}): {', '.join(left_out)}."]


def ranks(tables: Sequence[Table], methods: Sequence[str], alpha: float = 0.05) -> list[Summary]:
    """Per selection method: each algorithm's mean test accuracy (%) and rank per dataset, its average
    rank, best first; the notes give Friedman's test and the Nemenyi critical difference at `alpha`."""
    out = []
    for method in methods:
        runs = dataset_runs(tables, method)
        if not runs:
            continue
        datasets, algorithms, left_out = _complete(runs, "ranks")
        if len(algorithms) < 2:
            raise DomaingenError(f"collect ranks needs two algorithms with a result on every dataset; "
                                 f"{', '.join(algorithms) or 'none'} {'has' if len(algorithms) == 1 else 'have'} one")
        scores = pd.DataFrame({a: [sum(runs[d][a]) / len(runs[d][a]) for d in datasets] for a in algorithms},
                              index=datasets)
        result = friedman_nemenyi(scores, alpha)
        per_dataset_rank = scores.rank(axis=1, ascending=False, method="average")
        frame = pd.DataFrame(index=algorithms)
        for d in datasets:
            frame[f"{d} acc"] = 100 * scores.loc[d]
            frame[f"{d} rank"] = per_dataset_rank.loc[d]
        frame["mean acc"] = 100 * scores.mean(axis=0)
        frame["average rank"] = result.ranks
        frame = frame.sort_values(["average rank", "mean acc"], ascending=[True, False], kind="stable")
        k, n = len(algorithms), len(datasets)
        notes = [
            f"Friedman's test over {n} datasets and {k} algorithms: chi2_F = {result.chi2:.3f} (p = {result.p_chi2:.3g}, "
            f"{k - 1} degrees of freedom); Iman-Davenport F_F = {result.f_statistic:.3f} (p = {result.p_f:.3g}, "
            f"F({k - 1}, {(k - 1) * (n - 1)})).",
            f"Nemenyi critical difference at alpha = {alpha:g}: CD = {result.critical_difference:.3f} "
            f"(q_alpha = {result.q_alpha:.3f}); two algorithms whose average ranks differ by more differ significantly.",
            "Not separated by the CD: " + ("; ".join("{" + ", ".join(g) + "}" for g in result.groups) or "none") + ".",
            "Ranks: 1 = best per dataset, ties share their mean rank; a dataset's accuracy is the mean over trials of "
            "each trial's mean over its held-out environments (Demšar, JMLR 2006, Section 3.2.2).",
        ] + _left_out_note(left_out, datasets)
        title = f"Average ranks over datasets, {selection_method(method).description}"
        out.append(Summary(title, method, frame, notes, result))
    if not out:
        raise DomaingenError("collect ranks found no test table with single held-out environments to rank")
    return out


def intervals(tables: Sequence[Table], methods: Sequence[str], reps: int = 2000, confidence: float = 0.95,
              seed: int = 0) -> list[Summary]:
    """Per selection method: each algorithm's mean and IQM (%) of test accuracy over all runs (trials of
    every dataset), with stratified bootstrap percentile intervals (`reps` replicates, `seed`)."""
    out = []
    for method in methods:
        runs = dataset_runs(tables, method)
        if not runs:
            continue
        datasets, algorithms, left_out = _complete(runs, "intervals")
        rows = {}
        for algorithm in algorithms:
            strata = {d: runs[d][algorithm] for d in datasets}
            row: dict[str, object] = {"runs": sum(len(v) for v in strata.values())}
            for name, aggregate in AGGREGATES.items():
                interval = stratified_bootstrap(strata, aggregate, reps, confidence, seed)
                row[name] = 100 * interval.estimate
                row[f"{name} low"] = 100 * interval.low
                row[f"{name} high"] = 100 * interval.high
            rows[algorithm] = row
        frame = pd.DataFrame.from_dict(rows, orient="index").sort_values("IQM", ascending=False, kind="stable")
        notes = [
            f"Over every run (one trial of one dataset; {len(datasets)} datasets: {', '.join(datasets)}): the mean and "
            f"the interquartile mean (IQM, the mean of the middle 50%: scipy's 25% trimmed mean) of test accuracy, "
            f"with {100 * confidence:g}% stratified bootstrap percentile intervals ({reps} replicates, seed {seed}; each "
            "dataset's runs resampled on their own), as rliable defines them (Agarwal et al., NeurIPS 2021).",
            "A run's accuracy is its trial's mean over the dataset's held-out environments.",
        ] + _left_out_note(left_out, datasets)
        title = f"Mean and IQM over runs with {100 * confidence:g}% stratified bootstrap intervals, " \
                f"{selection_method(method).description}"
        out.append(Summary(title, method, frame, notes))
    if not out:
        raise DomaingenError("collect intervals found no test table with single held-out environments")
    return out


def _texts(frame: pd.DataFrame) -> pd.DataFrame:
    """Accuracies and intervals with one decimal, ranks with two, counts as they are; an interval as [low, high]."""
    shown = pd.DataFrame(index=frame.index)
    for column in frame.columns:
        if column.endswith((" low", " high")):
            continue
        values = frame[column]
        if f"{column} low" in frame:
            shown[column] = [f"{v:.1f} [{lo:.1f}, {hi:.1f}]" for v, lo, hi in
                             zip(values, frame[f"{column} low"], frame[f"{column} high"])]
        elif column.endswith("rank"):
            shown[column] = [f"{v:.2f}" for v in values]
        elif column == "runs":
            shown[column] = [str(int(v)) for v in values]
        else:
            shown[column] = [f"{v:.1f}" for v in values]
    return shown


def render(summaries: Sequence[Summary], fmt: str) -> str:
    """Markdown, LaTeX (booktabs, each table with its notes under it) or CSV (one line per algorithm and
    selection method, unrounded; `notes`, the table's notes, on its first line)."""
    if fmt == "csv":
        frames = []
        for s in summaries:
            frame = s.frame.reset_index(names="algorithm")
            frame.insert(0, "selection", s.key)
            frame["notes"] = [" ".join(s.notes)] + [""] * (len(frame) - 1)
            frames.append(frame)
        return pd.concat(frames, ignore_index=True).to_csv(index=False)
    out = io.StringIO()
    for s in summaries:
        shown = _texts(s.frame)
        if fmt == "markdown":
            out.write(f"### {s.title}\n\n")
            out.write(tabulate(shown.reset_index(names="Algorithm"), headers="keys", tablefmt="github",
                               showindex=False, disable_numparse=True))
            out.write("\n\n" + "".join(f"{line}\n" for line in s.notes) + "\n")
        else:
            out.write(latex_text_table(s.title, ["Algorithm", *shown.columns],
                                       [[name, *row] for name, row in zip(shown.index, shown.itertuples(index=False))],
                                       s.notes))
    if fmt == "latex":
        return latex_document(out.getvalue())
    return out.getvalue()
