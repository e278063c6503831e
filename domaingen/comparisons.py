"""Tables derived from the selected runs of `collect`'s test tables.

- Paired differences (`collect --paired`): algorithm A minus algorithm B, trial by
  trial. X and X+ModReg share their training seed at a trial (same initial weights,
  same minibatches), so the difference of their selected test accuracies at one
  trial_seed removes the restart's own noise; the cell is the mean ± error over
  trials of those differences, and says in how many trials A was lower.
- Record fields at the selected checkpoint (`collect --fields GLOB`): any number a
  run records (ModReg's kept fraction per layer, DMG's IoU, a penalty), read from
  the record of each trial's selected run and step, mean ± error over trials.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Sequence

import pandas as pd

from domaingen.errors import DomaingenError
from domaingen.reporting import Cell, Table

NOT_FIELDS = {"step", "epoch", "run", "dataset", "algorithm", "test_envs", "hparams_seed", "trial_seed", "hparams",
              "data_source", "base_algorithm"}


def _test_tables(tables: Sequence[Table]) -> list[Table]:
    return [t for t in tables if t.key.endswith("/test") and not t.key.startswith("all/")]


def _env_columns(table: Table) -> list[str]:
    return [c for c in table.columns if not c.startswith("Avg")]


def parse_pairs(specs: Sequence[str] | None) -> list[tuple[str, str]] | None:
    """`A:B` strings as (A, B) pairs; an empty list means "every X+Y beside its X"; None: no --paired."""
    if specs is None:
        return None
    pairs = []
    for spec in specs:
        a, sep, b = spec.partition(":")
        if not sep or not a or not b:
            raise DomaingenError(f"--paired takes ALGORITHM:BASE pairs (e.g. ERM+ModReg:ERM), got {spec!r}")
        pairs.append((a, b))
    return pairs


def default_pairs(algorithms: Sequence[str]) -> list[tuple[str, str]]:
    """(X+Y, X) for every composed algorithm X+Y whose base X is also in the table."""
    present = set(algorithms)
    return [(a, a.split("+", 1)[0]) for a in sorted(present) if "+" in a and a.split("+", 1)[0] in present]


def paired_cell(a: Cell, b: Cell) -> Cell:
    """A minus B over the trial_seeds both have a selected run for (trace order: trial_seed)."""
    if not a.values or not b.values:
        return Cell(missing="no runs to pair" if not (a.values or b.values) else "one side has no runs")
    by_trial_b = {t["trial_seed"]: (v, t) for v, t in zip(b.values, b.trace)}
    values, trace = [], []
    for value, t in zip(a.values, a.trace):
        if t["trial_seed"] in by_trial_b:
            other, u = by_trial_b[t["trial_seed"]]
            values.append(value - other)
            trace.append({"trial_seed": t["trial_seed"], "hparams_seed": f"{t['hparams_seed']}-{u['hparams_seed']}",
                          "step": f"{t['step']}-{u['step']}", "run": f"{t['run']}-{u['run']}"})
    if not values:
        return Cell(missing="no trial_seed in common")
    unpaired = len(a.values) + len(b.values) - 2 * len(values)
    note = f"lower in {sum(v < 0 for v in values)} of {len(values)} trials, higher in {sum(v > 0 for v in values)}"
    note += f"; {unpaired} unpaired trial(s) left out" if unpaired else ""
    return Cell(values, trace=trace, note=note)


def paired_tables(tables: Sequence[Table], pairs: Sequence[tuple[str, str]]) -> list[Table]:
    """Per test table: one row per pair 'A − B', a column per held-out environment.

    With `pairs` empty, every X+Y beside its X (default_pairs). Raises DomaingenError
    when a named algorithm is in no test table.
    """
    out = []
    named = {name for pair in pairs for name in pair}
    everywhere = {a for t in _test_tables(tables) for a in t.rows}
    unknown = sorted(named - everywhere)
    if unknown:
        raise DomaingenError(f"--paired names {', '.join(unknown)}, which no table has (algorithms: {', '.join(sorted(everywhere))})")
    for table in _test_tables(tables):
        wanted = list(pairs) or default_pairs(list(table.rows))
        wanted = [(a, b) for a, b in wanted if a in table.rows and b in table.rows]
        if not wanted:
            continue
        columns = _env_columns(table)
        rows = {f"{a} − {b}": [paired_cell(ca, cb) for ca, cb in zip(table.rows[a], table.rows[b])][: len(columns)]
                for a, b in wanted}
        dataset, method, _ = table.key.split("/")
        title = table.title.replace(": test accuracy,", ": paired differences of test accuracy (same trial_seed),", 1)
        out.append(Table(title, f"{dataset}/{method}/paired", columns, rows, data_source=table.data_source,
                         hparams_choice=table.hparams_choice))
    if not out and not pairs:
        raise DomaingenError("--paired found no composed algorithm X+Y beside its base X; name pairs as ALGORITHM:BASE")
    return out


def matching_fields(records: pd.DataFrame, patterns: Sequence[str]) -> list[str]:
    """Numeric record columns matching any glob in `patterns`, in pattern order then name order."""
    numeric = [c for c in records.columns if c not in NOT_FIELDS and pd.api.types.is_numeric_dtype(records[c])]
    found: list[str] = []
    for pattern in patterns:
        found += [c for c in sorted(numeric) if fnmatch.fnmatchcase(c, pattern) and c not in found]
    return found


def field_tables(tables: Sequence[Table], records: pd.DataFrame, patterns: Sequence[str]) -> list[Table]:
    """Per test table: rows = algorithms that record a matched field, columns = the matched fields
    (`field @ env` when several environments were held out), cells = the field's value in each
    trial's selected record. Raises DomaingenError when no record field matches."""
    fields = matching_fields(records, patterns)
    if not fields:
        raise DomaingenError(f"--fields {' '.join(patterns)} matches no numeric field of the records")
    indexed = records.drop_duplicates(["run", "step"], keep="last").set_index(["run", "step"])
    out = []
    for table in _test_tables(tables):
        envs = _env_columns(table)
        columns = [f if len(envs) == 1 else f"{f} @ {env}" for env in envs for f in fields]
        rows = {}
        for algorithm, cells in table.rows.items():
            row = []
            for cell in cells[: len(envs)]:
                for f in fields:
                    values, trace = [], []
                    for t in cell.trace:
                        key = (t.get("run"), t.get("step"))
                        value = indexed[f].get(key) if key in indexed.index else None
                        if value is not None and not (isinstance(value, float) and math.isnan(value)):
                            values.append(float(value))
                            trace.append(t)
                    row.append(Cell(values, trace=trace, percent=False) if values else Cell(missing="not recorded"))
            if any(c.values for c in row):
                rows[algorithm] = row
        if not rows:
            continue
        dataset, method, _ = table.key.split("/")
        title = table.title.replace(": test accuracy,", ": recorded fields at the selected checkpoint,", 1)
        out.append(Table(title, f"{dataset}/{method}/fields", columns, rows, data_source=table.data_source,
                         hparams_choice=table.hparams_choice))
    return out
