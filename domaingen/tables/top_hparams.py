"""`collect top-hparams`: which run, step and hyperparameters each selection chose, per trial.

The view of DomainBed's `list_top_hparams.py`, for the selected draws: per
selection method, dataset, algorithm, test environment and trial, the chosen run
directory, hparams_seed, step, hyperparameter values, and validation and test
accuracy. Every number in a table can be traced to the run behind it this way. With `fields`, the
selected checkpoint's recorded fields too (a run's kept weights, its training accuracy), one
column each, so that a spread over trials reads off the rows.
"""

from __future__ import annotations

import io
import json
from typing import Sequence

import pandas as pd
from tabulate import tabulate

from domaingen.tables.collect import Collection, n_environments, table_records
from domaingen.tables.comparisons import matching_fields
from domaingen.tables.reporting import environment_names
from domaingen.tables.selection import HPARAMS_CHOICE_TITLES, select, selection_method

COLUMNS = ["selection", "hparams_choice", "dataset", "algorithm", "test_env", "trial_seed", "hparams_seed", "step",
           "val_acc", "test_acc", "run", "hparams"]


def selected_runs(collection: Collection, methods: Sequence[str], hparams_choice: str = "per_trial",
                  fields: Sequence[str] = ()) -> pd.DataFrame:
    """One row per selection method and selected (dataset, algorithm, test_env, trial_seed): COLUMNS, then
    the record fields matching the globs `fields` at the selected checkpoint (NaN where not recorded).
    val_acc is NaN under a method that validates nothing (``last``)."""
    records = table_records(collection)
    names = matching_fields(collection.records, fields) if fields else []
    parts = []
    for method in methods:
        chosen = select(records, method, hparams_choice)
        if chosen.empty:
            continue
        if not selection_method(method).searches_hparams:
            # a method that searches nothing validates nothing: its val_acc is selection's tie placeholder
            chosen = chosen.assign(val_acc=float("nan"))
        parts.append(chosen.assign(selection=method, hparams_choice=hparams_choice))
    if not parts:
        return pd.DataFrame(columns=COLUMNS + names)
    frame = pd.concat(parts, ignore_index=True)[COLUMNS]
    if names:
        at = collection.records.drop_duplicates(["run", "step"]).set_index(["run", "step"])[names]
        keys = list(zip(frame["run"], frame["step"].astype(int)))
        frame = pd.concat([frame, at.reindex(keys).reset_index(drop=True)], axis=1)
    return frame


def top_hparams_csv(collection: Collection, methods: Sequence[str], hparams_choice: str = "per_trial",
                    fields: Sequence[str] = ()) -> str:
    """The selected runs as CSV (hyperparameters as one JSON column)."""
    return selected_runs(collection, methods, hparams_choice, fields).to_csv(index=False)


def _hparams_frame(rows: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame([json.loads(h) if isinstance(h, str) else {} for h in rows["hparams"]], index=rows.index)


def _value(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _field(v) -> str:
    return "—" if pd.isna(v) else f"{float(v):.4g}"


def _percent(acc: float) -> str:
    return "-" if pd.isna(acc) else f"{100 * acc:.2f}"


def top_hparams_markdown(collection: Collection, methods: Sequence[str], hparams_choice: str = "per_trial",
                         fields: Sequence[str] = ()) -> str:
    """Per method, dataset and algorithm, a table of the selected runs; constant hyperparameters listed once."""
    frame = selected_runs(collection, methods, hparams_choice, fields)
    field_names = list(frame.columns[len(COLUMNS):])
    out = io.StringIO()
    if frame.empty:
        return "No run could be selected.\n"
    records = collection.records
    for method in methods:
        mine = frame[frame["selection"] == method]
        suffix = "" if hparams_choice == "per_trial" else f", {HPARAMS_CHOICE_TITLES[hparams_choice]}"
        out.write(f"## Selected runs, {selection_method(method).description}{suffix}\n\n")
        if mine.empty:
            out.write("No run could be selected.\n\n")
            continue
        for (dataset, algorithm), rows in mine.groupby(["dataset", "algorithm"], sort=True):
            n_envs = n_environments(records, dataset)
            names = environment_names(dataset, n_envs)
            hp = _hparams_frame(rows)
            varying = [c for c in sorted(hp.columns) if hp[c].astype(str).nunique() > 1]
            constant = [c for c in sorted(hp.columns) if c not in varying]
            out.write(f"### {dataset}, {algorithm}\n\n")
            if constant:
                out.write("In every row: " + ", ".join(f"{c}={_value(hp[c].iloc[0])}" for c in constant) + "\n\n")
            body = [
                [names[int(r.test_env)] if int(r.test_env) < len(names) else r.test_env, int(r.trial_seed),
                 int(r.hparams_seed), int(r.step), _percent(r.val_acc), _percent(r.test_acc)]
                + [_value(hp.at[idx, c]) for c in varying] + [_field(rows.at[idx, n]) for n in field_names] + [r.run]
                for idx, r in zip(rows.index, rows.itertuples())
            ]
            headers = ["test env", "trial", "hparams_seed", "step", "val acc", "test acc"] + varying + field_names + ["run"]
            out.write(tabulate(body, headers=headers, tablefmt="github", disable_numparse=True))
            out.write("\n\n")
    return out.getvalue()
