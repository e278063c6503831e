"""Turn selected results into tables: Markdown, LaTeX (booktabs), CSV.

A cell is mean +/- standard error over trials (sample standard deviation,
ddof=1), in percent. A missing cell says what is missing.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
from tabulate import tabulate

from domaingen.collect import Collection, expand_modes, n_environments
from domaingen.datasets import DATASETS
from domaingen.selection import METHOD_TITLES, select


@dataclass
class Cell:
    """One table cell: the trials' accuracies, or why there are none."""

    values: list[float] = field(default_factory=list)
    missing: str = ""

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else math.nan

    @property
    def se(self) -> float:
        if len(self.values) < 2:
            return math.nan
        return float(np.std(self.values, ddof=1) / math.sqrt(len(self.values)))

    @property
    def std(self) -> float:
        """Sample standard deviation over trials (what the IRM paper's ± reports)."""
        return float(np.std(self.values, ddof=1)) if len(self.values) > 1 else math.nan

    def spread(self, error: str = "se") -> float:
        """The ± of a cell: "se" (standard error, the default) or "std"."""
        return self.std if error == "std" else self.se

    def text(self, show_n: bool = False, error: str = "se") -> str:
        if not self.values:
            return f"missing: {self.missing}" if self.missing else "missing"
        body = f"{100 * self.mean:.1f}" + (f" ± {100 * self.spread(error):.1f}" if self.n > 1 else "")
        return body + (f" (n={self.n})" if show_n else "")


@dataclass
class Table:
    """A titled grid of cells with row and column labels."""

    title: str
    key: str  # short machine name: dataset/selection/kind
    columns: list[str]
    rows: dict[str, list[Cell]]


def environment_names(dataset: str, n_envs: int) -> list[str]:
    if dataset in DATASETS and len(DATASETS.get(dataset).ENVIRONMENTS) == n_envs:
        return list(DATASETS.get(dataset).ENVIRONMENTS)
    return [f"env{i}" for i in range(n_envs)]


def _missing_reason(collection: Collection, dataset: str, algorithm: str, env: int, method: str) -> str:
    runs = collection.runs
    if runs.empty:
        return "no runs"
    mine = runs[(runs["dataset"] == dataset) & (runs["algorithm"] == algorithm)]
    singles = mine[mine["test_envs"].map(lambda e: tuple(e) == (env,))]
    counts = singles["state"].value_counts().to_dict()
    parts = [f"{counts[s]} {s}" for s in ("failed", "incomplete") if counts.get(s)]
    if not counts.get("done"):
        return f"no done run with test env {env}" + (f" ({', '.join(parts)})" if parts else "")
    if method == "loo":
        return f"pair runs holding out {{{env}, v}} for every other v"
    return "no usable checkpoint"


def _held_out_accuracy_missing(records: pd.DataFrame) -> bool:
    """True when no record has an accuracy on any of its test environments (e.g. known-domain rows)."""
    return not any(
        pd.notna(row.get(f"env{t}_in_acc")) for row in records.to_dict("records") for t in row["test_envs"]
    )


def _average_cell(cells: Sequence[Cell]) -> Cell:
    """Avg column: the mean of the environment means; its error bar from per-trial averages."""
    if not cells or any(not c.values for c in cells):
        missing = [c for c in cells if not c.values]
        return Cell(missing=f"{len(missing)} environment(s) missing")
    n = min(c.n for c in cells)
    # per-trial averages across environments give the spread; the mean equals the mean of means
    # when every cell has n trials
    per_trial = [float(np.mean([c.values[t] for c in cells])) for t in range(n)]
    if all(c.n == n for c in cells):
        return Cell(per_trial)
    return Cell([float(np.mean([c.mean for c in cells]))])


def dataset_tables(collection: Collection, method: str) -> tuple[list[Table], list[Table]]:
    """Per dataset: the test-accuracy table and the in-domain (training envs' out split) table.

    Test-time modes become rows of their own (collect.expand_modes); a mode with no
    test accuracy anywhere (known-domain: undefined on a held-out domain) has a row
    in the in-domain table only.
    """
    records = expand_modes(collection.records)
    bases = records.groupby("algorithm")["base_algorithm"].first().dropna().to_dict() if "base_algorithm" in records else {}
    selected = select(records, method)
    test_tables, indomain_tables = [], []
    for dataset in sorted(records["dataset"].unique()):
        n_envs = n_environments(records, dataset)
        names = environment_names(dataset, n_envs)
        test_rows, in_rows = {}, {}
        for algorithm in sorted(records[records["dataset"] == dataset]["algorithm"].unique()):
            mine = records[(records["dataset"] == dataset) & (records["algorithm"] == algorithm)]
            # oracle and leave-one-domain-out validate on held-out domains
            undefined = algorithm in bases and method != "training" and _held_out_accuracy_missing(mine)
            test_cells, in_cells = [], []
            test_defined = False
            for env in range(n_envs):
                chosen = selected[
                    (selected["dataset"] == dataset) & (selected["algorithm"] == algorithm) & (selected["test_env"] == env)
                ] if not selected.empty else selected
                if len(chosen):
                    ordered = chosen.sort_values("trial_seed")
                    test_defined |= bool(ordered["test_acc"].notna().any())
                    test_cells.append(Cell(ordered["test_acc"].astype(float).tolist()))
                    in_cells.append(Cell(ordered["indomain_acc"].astype(float).tolist()))
                else:
                    reason = (
                        "undefined: validated on held-out domains"
                        if undefined
                        else _missing_reason(collection, dataset, bases.get(algorithm, algorithm), env, method)
                    )
                    test_cells.append(Cell(missing=reason))
                    in_cells.append(Cell(missing=reason))
            if test_defined or algorithm not in bases:
                test_rows[algorithm] = test_cells + [_average_cell(test_cells)]
            in_rows[algorithm] = in_cells + [_average_cell(in_cells)]
        title = METHOD_TITLES[method]
        test_tables.append(Table(f"{dataset}: test accuracy, {title}", f"{dataset}/{method}/test", names + ["Avg"], test_rows))
        which = "in (training) splits" if method == "last" else "out splits"
        indomain_tables.append(
            Table(f"{dataset}: in-domain accuracy (training envs' {which}), {title}", f"{dataset}/{method}/indomain", names + ["Avg"], in_rows)
        )
    return test_tables, indomain_tables


def averages_table(test_tables: Sequence[Table], method: str) -> Table:
    """Rows: algorithms; columns: each dataset's Avg, then their mean."""
    datasets = [t.key.split("/")[0] for t in test_tables]
    algorithms = sorted({a for t in test_tables for a in t.rows})
    rows = {}
    for algorithm in algorithms:
        cells = [t.rows[algorithm][-1] if algorithm in t.rows else Cell(missing="not run") for t in test_tables]
        means = [c.mean for c in cells]
        overall = Cell([float(np.mean(means))]) if all(c.values for c in cells) else Cell(missing="a dataset is missing")
        rows[algorithm] = cells + [overall]
    return Table(f"Averages over datasets, {METHOD_TITLES[method]}", f"all/{method}/averages", datasets + ["Avg"], rows)


def build_tables(collection: Collection, methods: Sequence[str]) -> list[Table]:
    """Every table for the given selection methods, in reading order."""
    tables: list[Table] = []
    for method in methods:
        test_tables, indomain_tables = dataset_tables(collection, method)
        tables += test_tables
        tables.append(averages_table(test_tables, method))
        tables += indomain_tables
    return tables


# ---- formats -----------------------------------------------------------------


def to_markdown(tables: Sequence[Table], collection: Collection, show_n: bool = False, error: str = "se") -> str:
    out = io.StringIO()
    for table in tables:
        out.write(f"### {table.title}\n\n")
        body = [[alg] + [c.text(show_n, error) for c in cells] for alg, cells in table.rows.items()]
        out.write(tabulate(body, headers=["Algorithm"] + table.columns, tablefmt="github", disable_numparse=True))
        out.write("\n\n")
    out.write(_footer(collection))
    return out.getvalue()


def _footer(collection: Collection) -> str:
    lines = [f"{collection.records['run'].nunique()} done runs, {len(collection.records)} records."]
    if collection.failed:
        lines.append(f"Failed runs ({len(collection.failed)}), not counted:")
        lines += [f"- {run}: {reason}" for run, reason in collection.failed]
    if collection.incomplete:
        lines.append(f"Incomplete runs ({len(collection.incomplete)}), not counted.")
    return "\n".join(lines) + "\n"


LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_ESCAPES.get(ch, ch) for ch in text)


def _latex_cell(cell: Cell, show_n: bool, error: str = "se") -> str:
    if not cell.values:
        return r"\textit{" + latex_escape(cell.text()) + "}"
    text = f"{100 * cell.mean:.1f}" + (rf" $\pm$ {100 * cell.spread(error):.1f}" if cell.n > 1 else "")
    return text + (f" ({cell.n})" if show_n else "")


def to_latex(
    tables: Sequence[Table], collection: Collection, show_n: bool = False, bare: bool = False, error: str = "se"
) -> str:
    parts = []
    for table in tables:
        spec = "l" + "c" * len(table.columns)
        lines = [
            r"\begin{table}[ht]",
            r"\centering",
            r"\caption{" + latex_escape(table.title) + "}",
            r"\resizebox{\linewidth}{!}{%",
            r"\begin{tabular}{" + spec + "}",
            r"\toprule",
            " & ".join(["Algorithm"] + [latex_escape(c) for c in table.columns]) + r" \\",
            r"\midrule",
        ]
        for alg, cells in table.rows.items():
            lines.append(" & ".join([latex_escape(alg)] + [_latex_cell(c, show_n, error) for c in cells]) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}}", r"\end{table}", ""]
        parts.append("\n".join(lines))
    body = "\n".join(parts)
    if bare:
        return body
    return "\n".join(
        [
            r"\documentclass{article}",
            r"\usepackage[margin=2cm]{geometry}",
            r"\usepackage{booktabs}",
            r"\usepackage{graphicx}",
            r"\begin{document}",
            body,
            r"\end{document}",
            "",
        ]
    )


def to_csv(tables: Sequence[Table]) -> str:
    """Long format: one line per cell, with mean, standard error, trial count and any missing note."""
    rows = []
    for table in tables:
        dataset, method, kind = table.key.split("/")
        for alg, cells in table.rows.items():
            for column, cell in zip(table.columns, cells):
                rows.append(
                    {
                        "selection": method,
                        "table": kind,
                        "dataset": dataset,
                        "algorithm": alg,
                        "column": column,
                        "mean": cell.mean if cell.values else None,
                        "se": cell.se if cell.n > 1 else None,
                        "std": cell.std if cell.n > 1 else None,
                        "n": cell.n,
                        "missing": cell.missing if not cell.values else "",
                    }
                )
    return pd.DataFrame(rows).to_csv(index=False)
