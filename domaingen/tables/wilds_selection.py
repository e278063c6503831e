"""WILDS' model selection for its official splits: the OOD validation split's primary metric.

Every record of a run on an *Official dataset holds WILDS' summary metrics per split,
`wilds_<split>_<metric>` (the dataset's environment_metrics). WILDS selects a model by
its dataset's primary metric on the OOD validation split `val` (Camelyon17: acc_avg;
FMoW: acc_worst_region). Here, as DomainBed selects per trial, each trial keeps the
checkpoint, over every hparams draw and step, with the best validation metric; ties
go to the smaller hparams_seed, then to the earlier step (WILDS keeps a new best only
when it is strictly better).
"""

from __future__ import annotations

import pandas as pd

from domaingen.datasets import DATASETS

WILDS_PREFIX = "wilds_"
VAL_SPLIT = "val"
TEST_SPLIT = "test"
DEFAULT_METRIC = "acc_avg"


def primary_metric(dataset: str) -> str:
    """The metric WILDS selects and ranks by on this dataset."""
    if dataset in DATASETS:
        return getattr(DATASETS.get(dataset), "PRIMARY_METRIC", DEFAULT_METRIC)
    return DEFAULT_METRIC


def wilds_metric_columns(records: pd.DataFrame, dataset: str) -> list[str]:
    """The OOD test split's metric columns recorded for `dataset`: the primary one first."""
    mine = records[records["dataset"] == dataset]
    prefix = f"{WILDS_PREFIX}{TEST_SPLIT}_"
    found = sorted(c for c in mine.columns if c.startswith(prefix) and mine[c].notna().any())
    primary = prefix + primary_metric(dataset)
    return ([primary] if primary in found else []) + [c for c in found if c != primary]


def wilds_select(records: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, algorithm, test_envs, trial_seed): the record with the best OOD validation metric.

    Only records that carry it take part. Columns: the keys, hparams_seed, step, run,
    `selected_on` (the validation column), `val_metric`, and every wilds_* column.
    """
    parts = []
    for dataset, sub in records.groupby("dataset", sort=True):
        val_column = f"{WILDS_PREFIX}{VAL_SPLIT}_{primary_metric(dataset)}"
        if val_column not in sub or sub[val_column].isna().all():
            continue
        sub = sub[sub[val_column].notna()].copy()
        sub["selected_on"] = val_column
        sub["val_metric"] = sub[val_column].astype(float)
        ordered = sub.sort_values(["val_metric", "hparams_seed", "step"], ascending=[False, True, True], kind="stable")
        parts.append(ordered.drop_duplicates(["algorithm", "test_envs", "trial_seed"], keep="first"))
    if not parts:
        return pd.DataFrame(columns=["dataset", "algorithm", "test_envs", "trial_seed", "hparams_seed", "step", "run",
                                     "selected_on", "val_metric"])
    chosen = pd.concat(parts, ignore_index=True)
    return chosen.sort_values(["dataset", "algorithm", "trial_seed"], kind="stable").reset_index(drop=True)
