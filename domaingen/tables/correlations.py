"""`collect correlations`: does a recorded quantity predict accuracy? Spearman's rank correlation.

For each selection method and dataset, each run's record at the checkpoint the method selects
(the tables' own selection: the cells' traces) gives x = a field (`--fields`) and y = the mean
of the `--against` fields (e.g. the accuracy on several shifted probes). Spearman's rho and its
two-sided p (scipy.stats.spearmanr) are computed over the runs, and over the algorithms' means
of x and y, so that a reader sees whether a relation holds within and across methods.
`--without ALGORITHM` leaves algorithms out (does one method carry the relation?).
"""

from __future__ import annotations

import math
from typing import Sequence

import pandas as pd
from scipy.stats import spearmanr

from domaingen.errors import DomaingenError
from domaingen.tables.reporting import Table
from domaingen.tables.comparisons import matching_fields

MIN_POINTS = 3


def selected_points(tables: Sequence[Table], records: pd.DataFrame, fields: Sequence[str],
                    against: Sequence[str]) -> dict[str, pd.DataFrame]:
    """Per test table key ('dataset/method/test'): one row per selected run record, with its algorithm,
    every field and `y` (the mean of the `against` fields)."""
    indexed = records.drop_duplicates(["run", "step"], keep="last").set_index(["run", "step"])
    out = {}
    for table in tables:
        if not table.key.endswith("/test") or table.key.startswith("all/"):
            continue
        rows = []
        for algorithm, cells in table.rows.items():
            for cell in cells:
                for t in getattr(cell, "trace", None) or []:
                    key = (t.get("run"), t.get("step"))
                    if key not in indexed.index:
                        continue
                    record = indexed.loc[key]
                    row = {"algorithm": algorithm, "run": key[0]}
                    row.update({f: record.get(f) for f in list(fields) + list(against)})
                    rows.append(row)
        if rows:
            frame = pd.DataFrame(rows).drop_duplicates("run")
            frame["y"] = frame[list(against)].astype(float).mean(axis=1, skipna=False)
            out[table.key] = frame
    return out


def _spearman(x: pd.Series, y: pd.Series) -> tuple[float, float, int]:
    keep = x.notna() & y.notna()
    n = int(keep.sum())
    if n < MIN_POINTS or x[keep].nunique() < 2 or y[keep].nunique() < 2:
        return math.nan, math.nan, n
    result = spearmanr(x[keep].astype(float), y[keep].astype(float))
    return float(result.statistic), float(result.pvalue), n


def correlation_tables(tables: Sequence[Table], records: pd.DataFrame, field_patterns: Sequence[str],
                       against_patterns: Sequence[str], without: Sequence[str] = ()) -> dict[tuple[str, str], pd.DataFrame]:
    """(dataset, selection method) -> one row per field: Spearman's rho, p and n over the runs, and over the
    algorithms' means. Raises DomaingenError when a pattern matches no field or nothing is left to correlate."""
    fields = matching_fields(records, field_patterns, by_pattern=False)
    against = matching_fields(records, against_patterns, by_pattern=False)
    out = {}
    for key, frame in selected_points(tables, records, fields, against).items():
        unknown = [a for a in without if a not in set(frame["algorithm"])]
        if unknown:
            raise DomaingenError(f"--without {unknown[0]}: no such algorithm in the tables "
                                 f"({', '.join(sorted(set(frame['algorithm'])))})")
        frame = frame[~frame["algorithm"].isin(without)]
        means = frame.groupby("algorithm")[list(fields) + ["y"]].mean()
        rows = []
        for f in fields:
            rho, p, n = _spearman(frame[f], frame["y"])
            rho_m, p_m, n_m = _spearman(means[f], means["y"])
            rows.append({"field": f, "runs: rho": rho, "runs: p": p, "runs": n,
                         "algorithm means: rho": rho_m, "algorithm means: p": p_m, "algorithms": n_m})
        dataset, method, _ = key.split("/")
        out[(dataset, method)] = pd.DataFrame(rows)
    if not out:
        raise DomaingenError("no selected run records these fields; check --fields and --selection")
    return out


def title(against: Sequence[str], without: Sequence[str]) -> str:
    """The heading each table gets: what y is, and who was left out."""
    text = f"Spearman's rho of each field against the mean of {', '.join(against)}, at the selected checkpoint"
    return text + (f", without {', '.join(without)}" if without else "")
