"""`collect masks-x-domains`: every mask (or head) on every domain, over a sweep's trials.

`domaingen evaluate RUN --masks_x_domains` writes one run's matrix (DMG's Table 4) to
`RUN/diagnostics.json`. A paper's table is a mean over trials, so this view takes, per
(dataset, algorithm, test environment, trial), the run that training-domain validation
selects (the same rule as the accuracy tables, `hparams_choice` included) and averages
the matrices of those runs cell by cell, with the same error bar as the tables.

A selected run counts only when its matrix was computed at the checkpoint selection
chose (same step); the others are named under the table with the command that fills
them in, never silently averaged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from domaingen.errors import DomaingenError
from domaingen.inspect.masks_x_domains import SECTION, applied
from domaingen.tables.collect import Collection
from domaingen.tables.diagnostics import run_diagnostics
from domaingen.tables.reporting import ERROR_TITLES, Cell
from domaingen.tables.selection import select
from domaingen.tables.views import FORMATS


@dataclass
class MatrixTable:
    """One (dataset, algorithm, test environment): a Cell per (row, column) over the trials that have a matrix."""

    dataset: str
    algorithm: str
    test_env: int
    rows: list[str]
    columns: list[str]
    cells: list[list[Cell]]
    trials: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    unevaluated: list[str] = field(default_factory=list)  # "run (why)" for selected runs left out
    matrix: dict = field(default_factory=dict)  # the mean matrix in `evaluate --masks_x_domains`'s layout (report)


def _labels(matrix: dict, algorithm: str) -> tuple[list[str], list[str]]:
    unit = applied(algorithm)
    rows = [f"{unit} {name}" if i < matrix["train_rows"] else name for i, name in enumerate(matrix["rows"])]
    held_out = set(matrix.get("test_envs", ()))
    columns = [f"{name} ({split}{', held out' if env in held_out else ''})"
               for env, (name, split) in enumerate(zip(matrix["columns"], matrix["splits"]))]
    return rows, columns


def masks_matrix_tables(collection: Collection, input_dir: str | Path,
                        hparams_choice: str = "per_trial") -> list[MatrixTable]:
    """The matrices of the runs training-domain validation selects, averaged per cell over trials.

    Raises DomaingenError when no selected run has a matrix, or when the matrices of one
    cell disagree in their rows or columns (runs of different set-ups).
    """
    selected = select(collection.records, "training", hparams_choice)
    tables = []
    for (dataset, algorithm, test_env), chosen in selected.groupby(["dataset", "algorithm", "test_env"], sort=True):
        found, unevaluated, stale = [], [], False
        for _, pick in chosen.sort_values("trial_seed").iterrows():
            matrix = (run_diagnostics(input_dir, pick["run"]) or {}).get(SECTION)
            if matrix is None:
                unevaluated.append(f"{pick['run']} (trial {pick['trial_seed']}: no matrix)")
            elif int(matrix.get("step", -1)) != int(pick["step"]):
                stale = True
                unevaluated.append(f"{pick['run']} (trial {pick['trial_seed']}: matrix of step {matrix.get('step')}, "
                                   f"selection chose step {int(pick['step'])})")
            else:
                found.append((int(pick["trial_seed"]), int(pick["step"]), matrix))
        if not found:
            if stale:  # evaluated, but at other checkpoints: say so rather than drop the cell
                tables.append(MatrixTable(dataset, algorithm, int(test_env), [], [], [], unevaluated=unevaluated))
            continue  # otherwise an algorithm nobody evaluated this way (ERM beside DMG): no table
        shape = [(m["rows"], m["columns"], m["splits"]) for _, _, m in found]
        if any(s != shape[0] for s in shape):
            raise DomaingenError(f"{dataset} {algorithm} test env {test_env}: the runs' matrices differ in their rows "
                                 "or columns (different set-ups in one sweep): collect them apart")
        rows, columns = _labels(found[0][2], algorithm)
        cells = [[Cell(values=[float(m["accuracy"][i][j]) for _, _, m in found]) for j in range(len(columns))]
                 for i in range(len(rows))]
        mean = {**found[0][2], "accuracy": [[cell.mean for cell in row] for row in cells]}
        tables.append(MatrixTable(dataset, algorithm, int(test_env), rows, columns, cells,
                                  trials=[t for t, _, _ in found], steps=[s for _, s, _ in found],
                                  unevaluated=unevaluated, matrix=mean))
    if not any(t.cells for t in tables):
        raise DomaingenError("no selected run here has a mask-by-domain matrix: run `domaingen evaluate RUN "
                             "--masks_x_domains` on the DMG or MultiHead runs first")
    return tables


def _title(table: MatrixTable) -> str:
    return (f"{table.dataset}, {table.algorithm}, test env {table.test_env}: every "
            f"{applied(table.algorithm)} on every environment (accuracy, %), training-domain validation")


def matrix_text(tables: list[MatrixTable], fmt: str, error: str = "domainbed") -> str:
    """Markdown (a heading, the table and its notes per table) or CSV (one row per cell)."""
    if fmt not in FORMATS:
        raise DomaingenError(f"collect masks-x-domains prints markdown or csv, not {fmt}")
    if fmt == "csv":
        rows = []
        for t in tables:
            for i, row in enumerate(t.rows):
                for j, column in enumerate(t.columns):
                    cell = t.cells[i][j]
                    rows.append({"dataset": t.dataset, "algorithm": t.algorithm, "test_env": t.test_env,
                                 "applied": row, "environment": column, "mean": 100 * cell.mean,
                                 "error": 100 * cell.spread(error) if cell.n > 1 else float("nan"), "n": cell.n})
        return pd.DataFrame(rows).to_csv(index=False)
    parts = []
    for t in tables:
        text = f"### {_title(t)}\n\n"
        if t.cells:
            body = [[row] + [cell.text(error=error) for cell in t.cells[i]] for i, row in enumerate(t.rows)]
            text += tabulate(body, headers=["applied"] + t.columns, tablefmt="github", disable_numparse=True) + "\n\n"
            text += (f"Mean over trials {t.trials} (selected steps {', '.join(map(str, t.steps))}); "
                     f"a row applies one training domain's {applied(t.algorithm)} to every example "
                     "(`evaluate --masks_x_domains`).\n")
        if t.unevaluated:
            text += ("\nLeft out (run `domaingen evaluate RUN --masks_x_domains` on them): "
                     + "; ".join(t.unevaluated) + ".\n")
        parts.append(text)
    return "\n".join(parts) + f"\n{ERROR_TITLES[error]}.\n"
