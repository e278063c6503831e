"""Two views of a sweep's records besides the accuracy tables (`domaingen collect`).

- `collect trajectories --fields GLOB`: per dataset and algorithm, the mean over done runs of the
  matching record fields at every checkpoint step (e.g. ModReg's kept fraction and
  keep-probability quantiles per layer), so a reader sees how a quantity moves during
  training, not only where the selected checkpoint left it.
- `collect draws`: per algorithm, one row per hyperparameter draw (hparams_seed): the
  hyperparameters that differ between its draws, training-domain validation and test
  accuracy at each run's selected checkpoint per dataset (mean over its runs there),
  the validation averaged over datasets (the criterion a sweep that picks defaults
  reads), and with `--fields GLOB` those fields at each run's last checkpoint. Rows
  are sorted by that average, best first.
"""

from __future__ import annotations

import json
from typing import Sequence

import pandas as pd
from tabulate import tabulate

from domaingen.tables.comparisons import matching_fields
from domaingen.errors import DomaingenError
from domaingen.tables.selection import training_domain_validation

FORMATS = ("markdown", "csv")


def trajectories(records: pd.DataFrame, patterns: Sequence[str]) -> dict[tuple[str, str], pd.DataFrame]:
    """(dataset, algorithm) -> a frame indexed by step: `runs` (how many recorded the fields there) and the
    mean over those runs of every matching field. Pairs whose runs record none of the fields are left out."""
    fields = matching_fields(records, patterns, by_pattern=False)
    out = {}
    for (dataset, algorithm), sub in records.groupby(["dataset", "algorithm"], sort=True):
        present = [f for f in fields if sub[f].notna().any()]
        if not present:
            continue
        sub = sub[sub[present].notna().any(axis=1)]
        table = sub.groupby("step")[present].mean()
        table.insert(0, "runs", sub.groupby("step")["run"].nunique())
        table.index = table.index.astype(int)
        out[(dataset, algorithm)] = table
    return out


def _varying_hparams(hparams_json: pd.Series) -> list[str]:
    decoded = [json.loads(h) for h in hparams_json.unique()]
    keys = sorted({k for h in decoded for k in h})
    return [k for k in keys if len({json.dumps(h.get(k), sort_keys=True) for h in decoded}) > 1]


def draws_table(records: pd.DataFrame, field_patterns: Sequence[str] | None = None) -> dict[str, pd.DataFrame]:
    """algorithm -> one row per hparams_seed (see the module docstring), best average validation first.

    Accuracies are in percent. Each dataset draws its own values, so a hyperparameter whose value
    differs between a draw's datasets gets a column per dataset, `NAME (DATASET)`.
    """
    selected = training_domain_validation(records)
    if selected.empty:
        raise DomaingenError("collect draws needs runs with one test environment (training-domain validation)")
    fields = matching_fields(records, field_patterns, by_pattern=False) if field_patterns else []
    last = records.sort_values("step", kind="stable").drop_duplicates("run", keep="last").set_index("run")
    out = {}
    for algorithm, sub in selected.groupby("algorithm", sort=True):
        varying = _varying_hparams(sub["hparams"])
        datasets = sorted(sub["dataset"].unique())
        drawn = {seed: _hparams_by_dataset(draw) for seed, draw in sub.groupby("hparams_seed")}
        per_dataset = {k for k in varying for values in drawn.values()
                       if len({json.dumps(h.get(k), sort_keys=True) for h in values.values()}) > 1}
        rows = []
        for seed, draw in sub.groupby("hparams_seed"):
            row: dict[str, object] = {"hparams_seed": int(seed)}
            for k in varying:
                if k in per_dataset:
                    row.update({f"{k} ({d})": drawn[seed][d].get(k) if d in drawn[seed] else None for d in datasets})
                else:
                    row[k] = next(iter(drawn[seed].values())).get(k)
            for dataset in datasets:
                runs = draw[draw["dataset"] == dataset]
                row[f"{dataset} val"] = 100 * runs["val_acc"].mean() if len(runs) else float("nan")
                row[f"{dataset} test"] = 100 * runs["test_acc"].mean() if len(runs) else float("nan")
                for field in fields:
                    row[f"{dataset} {field} (last)"] = last.loc[runs["run"], field].mean() if len(runs) else float("nan")
            row["mean val"] = sum(row[f"{d} val"] for d in datasets) / len(datasets)
            row["runs"] = len(draw)
            rows.append(row)
        out[algorithm] = pd.DataFrame(rows).sort_values(["mean val", "hparams_seed"], ascending=[False, True],
                                                        kind="stable").reset_index(drop=True)
    return out


def _hparams_by_dataset(draw: pd.DataFrame) -> dict[str, dict]:
    """dataset -> the hyperparameters of its first run in `draw` (one hparams_seed)."""
    first = draw.sort_values(["dataset", "run"]).drop_duplicates("dataset")
    return {row.dataset: json.loads(row.hparams) for row in first.itertuples()}


def _formatted(frame: pd.DataFrame) -> pd.DataFrame:
    """Numbers as text: accuracies with one decimal, small or large hyperparameters with three digits."""
    def cell(column: str, value: object) -> object:
        if isinstance(value, float):
            if column.endswith((" val", " test")) or column == "mean val":
                return f"{value:.1f}"
            return f"{value:.3g}"
        return value

    return pd.DataFrame({c: [cell(c, v) for v in frame[c]] for c in frame.columns})


def render(tables: dict, title: str, fmt: str, key_names: tuple[str, str] = ("dataset", "algorithm")) -> str:
    """Markdown (a heading and a table per key) or CSV (the tables stacked, the key in leading columns,
    named `key_names` for a pair, `algorithm` for one)."""
    if fmt not in FORMATS:
        raise DomaingenError(f"collect trajectories and draws print markdown or csv, not {fmt}")
    if fmt == "csv":
        frames = []
        for key, frame in tables.items():
            frame = frame.reset_index() if frame.index.name == "step" else frame
            names = key_names if isinstance(key, tuple) else ("algorithm",)
            keys = key if isinstance(key, tuple) else (key,)
            frames.append(frame.assign(**dict(zip(names, keys)))[list(names) + list(frame.columns)])
        return pd.concat(frames, ignore_index=True).to_csv(index=False)
    parts = []
    for key, frame in tables.items():
        label = ", ".join(key) if isinstance(key, tuple) else key
        frame = frame.reset_index() if frame.index.name == "step" else frame
        parts.append(f"### {label}: {title}\n\n"
                     + tabulate(_formatted(frame), headers="keys", tablefmt="github", showindex=False,
                                disable_numparse=True) + "\n")
    return "\n".join(parts)
