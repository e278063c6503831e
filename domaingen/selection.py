"""The three model-selection methods, as pure functions of the records DataFrame.

Each method first chooses one checkpoint per run (per group of runs, for
leave-one-domain-out), giving a validation and a test accuracy per
(dataset, algorithm, test_env, hparams_seed, trial_seed). `select` then picks,
per (dataset, algorithm, test_env), the hparams_seed whose validation accuracy
averaged over trials is best, and returns that hparams_seed's trials.

Ties: between checkpoints, the later step wins; between hparams draws, the
smaller hparams_seed wins.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from domaingen.collect import n_environments

RUN_COLUMNS = ["dataset", "algorithm", "test_env", "hparams_seed", "trial_seed"]
RESULT_COLUMNS = RUN_COLUMNS + ["step", "val_acc", "test_acc", "indomain_acc"]


def _acc_matrix(records: pd.DataFrame, split: str, n_envs: int) -> np.ndarray:
    cols = [f"env{i}_{split}_acc" for i in range(n_envs)]
    return records.reindex(columns=cols).to_numpy(dtype=float)


def _train_env_mask(test_envs: pd.Series, n_envs: int) -> np.ndarray:
    mask = np.ones((len(test_envs), n_envs), dtype=bool)
    for row, envs in enumerate(test_envs):
        mask[row, list(envs)] = False
    return mask


def _single_test_env_records(records: pd.DataFrame) -> pd.DataFrame:
    singles = records[records["test_envs"].map(len) == 1].copy()
    singles["test_env"] = singles["test_envs"].map(lambda e: e[0])
    return singles


def _per_dataset(records: pd.DataFrame, fn: Callable[[pd.DataFrame, int], pd.DataFrame]) -> pd.DataFrame:
    parts = [fn(sub, n_environments(records, ds)) for ds, sub in records.groupby("dataset", sort=True)]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=RESULT_COLUMNS)


def _pick_best(frame: pd.DataFrame, group: list[str]) -> pd.DataFrame:
    """The row with the best val_acc per group; the later step wins a tie."""
    ordered = frame.sort_values(["val_acc", "step"], ascending=[False, False], kind="stable")
    return ordered.drop_duplicates(group, keep="first")


def training_domain_validation(records: pd.DataFrame) -> pd.DataFrame:
    """Per run, the checkpoint with the best mean `out` accuracy over training environments."""

    def one(sub: pd.DataFrame, n_envs: int) -> pd.DataFrame:
        sub = _single_test_env_records(sub)
        if sub.empty:
            return sub
        mask = _train_env_mask(sub["test_envs"], n_envs)
        out = _acc_matrix(sub, "out", n_envs)
        inn = _acc_matrix(sub, "in", n_envs)
        sub["val_acc"] = np.where(mask, out, 0.0).sum(1) / mask.sum(1)
        sub["indomain_acc"] = sub["val_acc"]
        sub["test_acc"] = inn[np.arange(len(sub)), sub["test_env"].to_numpy()]
        return _pick_best(sub, ["run"])[RESULT_COLUMNS]

    return _per_dataset(records, one)


def oracle_test_domain_validation(records: pd.DataFrame) -> pd.DataFrame:
    """Oracle: the last checkpoint only; validation is the test env's `out` accuracy."""

    def one(sub: pd.DataFrame, n_envs: int) -> pd.DataFrame:
        sub = _single_test_env_records(sub)
        if sub.empty:
            return sub
        last = sub.sort_values("step", kind="stable").drop_duplicates("run", keep="last").copy()
        rows = np.arange(len(last))
        envs = last["test_env"].to_numpy()
        last["val_acc"] = _acc_matrix(last, "out", n_envs)[rows, envs]
        last["test_acc"] = _acc_matrix(last, "in", n_envs)[rows, envs]
        mask = _train_env_mask(last["test_envs"], n_envs)
        last["indomain_acc"] = np.where(mask, _acc_matrix(last, "out", n_envs), 0.0).sum(1) / mask.sum(1)
        return last[RESULT_COLUMNS]

    return _per_dataset(records, one)


def leave_one_domain_out(records: pd.DataFrame) -> pd.DataFrame:
    """Validation of v for test env t: v's `in` accuracy in the run holding out {t, v}, averaged over v.

    Needs, per (hparams_seed, trial_seed), the single run {t} and every pair run
    {t, v}, at the same step; a step missing any of them is not considered.
    """

    def one(sub: pd.DataFrame, n_envs: int) -> pd.DataFrame:
        key = ["algorithm", "hparams_seed", "trial_seed", "step"]
        singles = _single_test_env_records(sub)
        pairs = sub[sub["test_envs"].map(len) == 2]
        if singles.empty or pairs.empty:
            return pd.DataFrame(columns=RESULT_COLUMNS)
        # one row per (pair run, held-out env t): the other env v's in-accuracy
        halves = []
        for t_pos, v_pos in ((0, 1), (1, 0)):
            half = pairs[key].copy()
            half["test_env"] = pairs["test_envs"].map(lambda e, p=t_pos: e[p]).to_numpy()
            v = pairs["test_envs"].map(lambda e, p=v_pos: e[p]).to_numpy()
            half["v_acc"] = _acc_matrix(pairs, "in", n_envs)[np.arange(len(pairs)), v]
            halves.append(half)
        per_v = pd.concat(halves, ignore_index=True)
        val = per_v.groupby(key + ["test_env"], sort=False)["v_acc"].agg(["mean", "count"]).reset_index()
        val = val[val["count"] == n_envs - 1].rename(columns={"mean": "val_acc"})
        rows = np.arange(len(singles))
        singles = singles.copy()
        singles["test_acc"] = _acc_matrix(singles, "in", n_envs)[rows, singles["test_env"].to_numpy()]
        mask = _train_env_mask(singles["test_envs"], n_envs)
        singles["indomain_acc"] = np.where(mask, _acc_matrix(singles, "out", n_envs), 0.0).sum(1) / mask.sum(1)
        joined = singles.merge(val[key + ["test_env", "val_acc"]], on=key + ["test_env"], how="inner")
        if joined.empty:
            return pd.DataFrame(columns=RESULT_COLUMNS)
        return _pick_best(joined, ["algorithm", "hparams_seed", "trial_seed", "test_env"])[RESULT_COLUMNS]

    return _per_dataset(records, one)


def final_checkpoint(records: pd.DataFrame) -> pd.DataFrame:
    """No model selection (the IRM paper's protocol): every run's last checkpoint.

    val_acc is constant, so `select` keeps the smallest hparams_seed (hyperparameters
    are fixed, not searched); indomain_acc is the mean `in` (training) accuracy over
    the training environments, the paper's "train accuracy".
    """

    def one(sub: pd.DataFrame, n_envs: int) -> pd.DataFrame:
        sub = _single_test_env_records(sub)
        if sub.empty:
            return sub
        last = sub.sort_values("step", kind="stable").drop_duplicates("run", keep="last").copy()
        rows = np.arange(len(last))
        inn = _acc_matrix(last, "in", n_envs)
        last["val_acc"] = 0.0
        last["test_acc"] = inn[rows, last["test_env"].to_numpy()]
        mask = _train_env_mask(last["test_envs"], n_envs)
        last["indomain_acc"] = np.where(mask, inn, 0.0).sum(1) / mask.sum(1)
        return last[RESULT_COLUMNS]

    return _per_dataset(records, one)


METHODS: dict[str, Callable[[pd.DataFrame], pd.DataFrame]] = {
    "training": training_domain_validation,
    "loo": leave_one_domain_out,
    "oracle": oracle_test_domain_validation,
    "last": final_checkpoint,
}
METHOD_TITLES = {
    "training": "training-domain validation",
    "loo": "leave-one-domain-out cross-validation",
    "oracle": "test-domain validation (oracle)",
    "last": "no selection: final checkpoint, fixed hyperparameters",
}


def select(records: pd.DataFrame, method: str) -> pd.DataFrame:
    """Per (dataset, algorithm, test_env): the trials of the hparams draw with the best mean validation."""
    per_run = METHODS[method](records)
    # a checkpoint without a validation accuracy (a test-time mode undefined on the validation
    # split, e.g. known-domain on the test env under oracle selection) cannot be selected
    per_run = per_run[per_run["val_acc"].notna()]
    if per_run.empty:
        return per_run
    per_run = per_run.astype({"hparams_seed": int, "trial_seed": int, "test_env": int})
    means = per_run.groupby(["dataset", "algorithm", "test_env", "hparams_seed"], as_index=False)["val_acc"].mean()
    best = means.sort_values(["val_acc", "hparams_seed"], ascending=[False, True], kind="stable")
    best = best.drop_duplicates(["dataset", "algorithm", "test_env"], keep="first")
    chosen = per_run.merge(best[["dataset", "algorithm", "test_env", "hparams_seed"]], how="inner")
    return chosen.sort_values(RUN_COLUMNS, kind="stable").reset_index(drop=True)
