"""Model selection, as pure functions of the records DataFrame, following DomainBed's protocol.

Two stages:

1. A *method* (the SELECTION_METHODS table) chooses one checkpoint per run (per group
   of runs, for leave-one-domain-out) and gives it a validation and a test accuracy:
   one row per (dataset, algorithm, test_env, hparams_seed, trial_seed). A method
   registers itself with `register_selection_method`, declaring what the tables need
   to know about it (its caption, whether it validates on pair runs, ...); a plugin
   adds its own the same way.
2. `select` chooses hyperparameter draws. The default, ``per_trial``, is DomainBed's
   (``collect_results.py``): per (dataset, algorithm, test_env, trial_seed), the draw
   with the best validation accuracy; a table cell is the mean over trials of the
   chosen draws' test accuracies, so every trial replicates the whole search and its
   spread includes the selection noise. ``pooled`` picks
   one draw per (dataset, algorithm, test_env) by validation accuracy averaged over
   trials and reports that draw's trials.

Ties, as DomainBed breaks them: between checkpoints of one run, the earliest step
wins (its argmax keeps the first maximum); between hparams draws under ``per_trial``,
the *largest* hparams_seed wins (it sorts the draws by hparams_seed, then stably by
validation accuracy, and reverses the list). ``pooled`` keeps the smallest
hparams_seed on a tie. A method that searches no hyperparameters (``last``) validates
nothing, so it always keeps the smallest hparams_seed.

Validation accuracies are computed with the same floating-point operations as
DomainBed's (numpy means over the environments in index order), so exact ties
between checkpoints are decided as DomainBed decides them.

What the tables mark: `select` says, per trial, whether the selected checkpoint is
step 0 (recorded after the first update, as DomainBed records it: a network hardly
trained, nearly the same for every algorithm that shares a draw and a trial) in its
``step`` column, and
whether every candidate it chose among (every checkpoint of every draw, two or more)
had the same validation accuracy in ``tied``: the choice was then DomainBed's
tie-break, not a comparison. Both are DomainBed's rule applied faithfully; the tables
mark such cells so that a reader does not take them for a bug. ``last`` selects
nothing and never reports a tie.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from domaingen.errors import DomaingenError
from domaingen.registry import Registry, owner
from domaingen.tables.collect import n_environments

log = logging.getLogger(__name__)

RUN_COLUMNS = ["dataset", "algorithm", "test_env", "hparams_seed", "trial_seed"]
RESULT_COLUMNS = RUN_COLUMNS + ["step", "val_acc", "test_acc", "indomain_acc", "run", "hparams"]
# what a method adds to RESULT_COLUMNS per run: how many checkpoints it chose among and their lowest val_acc
CANDIDATE_COLUMNS = ["candidates", "val_min"]
METHOD_COLUMNS = RESULT_COLUMNS + CANDIDATE_COLUMNS
SELECTED_COLUMNS = RESULT_COLUMNS + ["tied"]
HPARAMS_CHOICES = ("per_trial", "pooled")
HPARAMS_CHOICE_TITLES = {
    "per_trial": "hparams chosen per trial (DomainBed)",
    "pooled": "hparams chosen once per cell, by validation averaged over trials (pooled)",
}


@dataclass(frozen=True)
class SelectionMethod:
    """A model-selection method: its function and what the tables need to know about it.

    `select` maps the records DataFrame to one row per run (per group of runs) with
    RUN_COLUMNS, step, val_acc, test_acc and indomain_acc (run, hparams and
    CANDIDATE_COLUMNS are filled in when absent); `description` is the caption
    ("training-domain validation"); `pairs`: it validates on runs that hold out a pair
    of environments, which a cell then needs; `default`: collect uses it when no
    --selection is given (a `pairs` method only when the sweep has pair runs);
    `held_out_validation`: it validates on the held-out domain, so a test-time mode
    without held-out accuracy (known-domain) is undefined under it; `searches_hparams`:
    False for a method that validates nothing, whose hyperparameters are fixed (the
    smallest hparams_seed is kept); `in_domain_split`: the training environments' split
    its in-domain accuracy reads, "out" (the validation split) or "in".
    """

    name: str
    select: Callable[[pd.DataFrame], pd.DataFrame]
    description: str
    pairs: bool = False
    default: bool = False
    held_out_validation: bool = False
    searches_hparams: bool = True
    in_domain_split: str = "out"

    @property
    def __wrapped__(self) -> Callable[[pd.DataFrame], pd.DataFrame]:
        # the registry names the function's module as the entry's owner
        return self.select


SELECTION_METHODS: Registry[SelectionMethod] = Registry("selection method")


def register_selection_method(
    name: str, description: str, *, pairs: bool = False, default: bool = False, held_out_validation: bool = False,
    searches_hparams: bool = True, in_domain_split: str = "out",
) -> Callable[[Callable[[pd.DataFrame], pd.DataFrame]], Callable[[pd.DataFrame], pd.DataFrame]]:
    """Decorator: register the function as the selection method `name` (see SelectionMethod for the
    arguments); the function itself is returned unchanged. A name taken already raises NameClashError."""
    if in_domain_split not in ("out", "in"):
        raise ValueError(f"in_domain_split is 'out' or 'in', not {in_domain_split!r}")

    def decorate(fn: Callable[[pd.DataFrame], pd.DataFrame]) -> Callable[[pd.DataFrame], pd.DataFrame]:
        SELECTION_METHODS.register(name)(SelectionMethod(
            name, fn, description, pairs=pairs, default=default, held_out_validation=held_out_validation,
            searches_hparams=searches_hparams, in_domain_split=in_domain_split))
        return fn

    return decorate


def selection_method(name: str) -> SelectionMethod:
    """The registered method `name` (any case); an unknown name raises one line listing the valid ones."""
    return SELECTION_METHODS.get(name)


def selection_method_names() -> list[str]:
    """Every registered selection method's name, built-in ones first (the CLI's --selection choices)."""
    return SELECTION_METHODS.names()


def default_selection_methods(has_pairs: bool) -> list[str]:
    """collect's methods when none is asked for: the default ones, then those that validate on pair
    runs when the sweep has pair runs (training, oracle, then loo)."""
    entries = [SELECTION_METHODS.get(name) for name in SELECTION_METHODS]
    singles = [m.name for m in entries if m.default and not m.pairs]
    return singles + ([m.name for m in entries if m.default and m.pairs] if has_pairs else [])


def pair_methods_left_out(has_pairs: bool) -> str:
    """A note for tables built with collect's default methods: the default methods that need pair
    runs, which a sweep without them cannot show, and how to get them ('' when none is left out)."""
    if has_pairs:
        return ""
    left_out = [SELECTION_METHODS.get(n) for n in default_selection_methods(True) if n not in default_selection_methods(False)]
    if not left_out:
        return ""
    names = ", ".join(f"{m.description} ({m.name})" for m in left_out)
    return (f"Not shown: {names}, which needs pair runs; this sweep has none (add `pairs = true` to the spec, "
            "or relaunch with `sweep launch --pairs`).")


def selection_methods_help() -> str:
    """The --selection help text: each method and its caption, and the default (escaped for argparse)."""
    entries = [SELECTION_METHODS.get(name) for name in SELECTION_METHODS]
    described = "; ".join(f"{m.name}: {m.description}" + (" (needs pair runs)" if m.pairs else "") for m in entries)
    singles = [m.name for m in entries if m.default and not m.pairs]
    default = " and ".join(singles) + "".join(
        f", then {m.name} when pair runs exist" for m in entries if m.default and m.pairs)
    return f"{described}; default: {default}".replace("%", "%%")


def _acc_matrix(records: pd.DataFrame, split: str, n_envs: int) -> np.ndarray:
    cols = [f"env{i}_{split}_acc" for i in range(n_envs)]
    return records.reindex(columns=cols).to_numpy(dtype=float)


def _single_test_env_records(records: pd.DataFrame) -> pd.DataFrame:
    singles = records[records["test_envs"].map(len) == 1].copy()
    singles["test_env"] = singles["test_envs"].map(lambda e: e[0])
    return singles


def _mean_over_training_envs(records: pd.DataFrame, split: str, n_envs: int) -> np.ndarray:
    """Per row, the mean `split` accuracy over the environments other than its test_env.

    np.mean over the other environments in index order: the same floating-point
    result as DomainBed's np.mean over a list of them, so exact ties stay ties.
    """
    acc = _acc_matrix(records, split, n_envs)
    test_env = records["test_env"].to_numpy()
    result = np.full(len(records), np.nan)
    for env in np.unique(test_env):
        rows = test_env == env
        others = [i for i in range(n_envs) if i != env]
        result[rows] = np.mean(acc[np.ix_(rows, others)], axis=1)
    return result


def _in_domain_acc(records: pd.DataFrame, fallback: str, n_envs: int) -> np.ndarray:
    """Per row, the in-domain accuracy: for a run with --in_domain_test, the mean over its training
    environments of their in-domain test splits (`idtest`; NaN at a checkpoint that did not
    evaluate them), else of the `fallback` split ('out' or 'in')."""
    own = _mean_over_training_envs(records, fallback, n_envs)
    if not any(f"env{i}_idtest_acc" in records.columns for i in range(n_envs)):
        return own
    idtest = _mean_over_training_envs(records, "idtest", n_envs)
    return np.where(runs_with_in_domain_test(records), idtest, own)


def runs_with_in_domain_test(records: pd.DataFrame) -> np.ndarray:
    """Per row, whether its run has in-domain test splits: its `in_domain_test` argument where
    records carry it, else whether the row holds an in-domain test accuracy. Per run, not per
    checkpoint: under `--eval_splits final` most checkpoints do not evaluate the splits."""
    columns = [c for c in records.columns if c.startswith("env") and c.endswith("_idtest_acc")]
    held = records[columns].notna().any(axis=1).to_numpy() if columns else np.zeros(len(records), dtype=bool)
    if "in_domain_test" not in records:
        return held
    fraction = pd.to_numeric(records["in_domain_test"], errors="coerce").to_numpy(dtype=float)
    return np.where(np.isnan(fraction), held, fraction > 0)


def has_in_domain_test(records: pd.DataFrame) -> bool:
    """Whether some run of `records` has in-domain test splits (--in_domain_test)."""
    return bool(runs_with_in_domain_test(records).any())


def _test_acc(records: pd.DataFrame, split: str, n_envs: int) -> np.ndarray:
    return _acc_matrix(records, split, n_envs)[np.arange(len(records)), records["test_env"].to_numpy()]


def _per_dataset(records: pd.DataFrame, fn: Callable[[pd.DataFrame, int], pd.DataFrame]) -> pd.DataFrame:
    parts = [fn(sub, n_environments(records, ds)) for ds, sub in records.groupby("dataset", sort=True)]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=METHOD_COLUMNS)


def _with_defaults(frame: pd.DataFrame) -> pd.DataFrame:
    """Frames built by hand (tests, other readers) may lack the traceability columns."""
    if "run" not in frame.columns:
        frame = frame.assign(run="")
    if "hparams" not in frame.columns:
        frame = frame.assign(hparams="{}")
    return frame


def _earliest_best(frame: pd.DataFrame, group: list[str]) -> pd.DataFrame:
    """Per group, the row with the best val_acc; on a tie the earliest step (DomainBed's argmax).

    Adds CANDIDATE_COLUMNS: the group's number of checkpoints with a validation accuracy
    and the lowest of them (a group whose lowest equals its best had nothing to choose).
    """
    frame = frame.copy()
    grouped = frame.groupby(group, sort=False)["val_acc"]
    frame["candidates"] = grouped.transform("count")
    frame["val_min"] = grouped.transform("min")
    ordered = frame.sort_values(["val_acc", "step"], ascending=[False, True], kind="stable")
    return ordered.drop_duplicates(group, keep="first")


def _single_candidates(frame: pd.DataFrame) -> pd.DataFrame:
    """CANDIDATE_COLUMNS of a method that keeps one checkpoint per run (no early stopping)."""
    return frame.assign(candidates=frame["val_acc"].notna().astype(int), val_min=frame["val_acc"])


def _scored(sub: pd.DataFrame, n_envs: int) -> pd.DataFrame:
    """The single-test-environment checkpoints of one dataset with test_env, val_acc (mean `out`
    accuracy over the training environments), indomain_acc and test_acc (the test env's `in`)."""
    sub = _with_defaults(_single_test_env_records(sub))
    if sub.empty:
        return sub
    sub["val_acc"] = _mean_over_training_envs(sub, "out", n_envs)
    sub["indomain_acc"] = _in_domain_acc(sub, "out", n_envs)
    sub["test_acc"] = _test_acc(sub, "in", n_envs)
    return sub


def scored_checkpoints(records: pd.DataFrame) -> pd.DataFrame:
    """Every checkpoint of every run that holds out one environment, with test_env, val_acc (its
    training-domain validation accuracy), test_acc and indomain_acc: what a selection method
    chooses among (a plugin's method picks rows of it, one per run)."""
    return _per_dataset(records, _scored)


@register_selection_method("training", "training-domain validation", default=True)
def training_domain_validation(records: pd.DataFrame) -> pd.DataFrame:
    """Per run, the checkpoint with the best mean `out` accuracy over training environments."""

    def one(sub: pd.DataFrame, n_envs: int) -> pd.DataFrame:
        sub = _scored(sub, n_envs)
        return sub if sub.empty else _earliest_best(sub, ["run"])[METHOD_COLUMNS]

    return _per_dataset(records, one)


def _last_checkpoints(sub: pd.DataFrame) -> pd.DataFrame:
    return sub.sort_values("step", kind="stable").drop_duplicates("run", keep="last").copy()


@register_selection_method("loo", "leave-one-domain-out cross-validation", pairs=True, default=True,
                           held_out_validation=True)
def leave_one_domain_out(records: pd.DataFrame) -> pd.DataFrame:
    """Validation of v for test env t: v's `in` accuracy in the run holding out {t, v}, averaged over v.

    Needs, per (hparams_seed, trial_seed), the single run {t} and every pair run
    {t, v}, at the same step; a step missing any of them is not considered. The
    average is DomainBed's: the sum over v in index order, divided by n_envs - 1.
    """

    def one(sub: pd.DataFrame, n_envs: int) -> pd.DataFrame:
        key = ["algorithm", "hparams_seed", "trial_seed", "step"]
        singles = _with_defaults(_single_test_env_records(sub))
        pairs = sub[sub["test_envs"].map(len) == 2]
        if singles.empty or pairs.empty:
            return pd.DataFrame(columns=METHOD_COLUMNS)
        # one row per (pair run, held-out env t): the other env v's in-accuracy
        halves = []
        pair_in = _acc_matrix(pairs, "in", n_envs)
        for t_pos, v_pos in ((0, 1), (1, 0)):
            half = pairs[key].copy()
            half["test_env"] = pairs["test_envs"].map(lambda e, p=t_pos: e[p]).to_numpy()
            half["v"] = pairs["test_envs"].map(lambda e, p=v_pos: e[p]).to_numpy()
            half["v_acc"] = pair_in[np.arange(len(pairs)), half["v"].to_numpy()]
            halves.append(half)
        per_v = pd.concat(halves, ignore_index=True)
        # columns v = 0..n_envs-1 (NaN where no pair run); a duplicate pair run keeps the last record
        wide = per_v.pivot_table(index=key + ["test_env"], columns="v", values="v_acc", aggfunc="last")
        wide = wide.reindex(columns=range(n_envs)).reset_index()
        t = wide["test_env"].to_numpy()
        vals = wide[list(range(n_envs))].to_numpy(dtype=float)
        others = np.array([[v for v in range(n_envs) if v != env] for env in t]).reshape(len(t), n_envs - 1)
        picked = np.take_along_axis(vals, others, axis=1)
        complete = ~np.isnan(picked).any(axis=1)
        wide["val_acc"] = np.sum(picked, axis=1) / (n_envs - 1)
        val = wide[complete][key + ["test_env", "val_acc"]]
        singles = singles.copy()
        singles["test_acc"] = _test_acc(singles, "in", n_envs)
        singles["indomain_acc"] = _in_domain_acc(singles, "out", n_envs)
        val = val.astype({"hparams_seed": singles["hparams_seed"].dtype, "trial_seed": singles["trial_seed"].dtype})
        joined = _held_out_at_every_checkpoint(singles.merge(val, on=key + ["test_env"], how="inner"))
        if joined.empty:
            return pd.DataFrame(columns=METHOD_COLUMNS)
        return _earliest_best(joined, ["algorithm", "hparams_seed", "trial_seed", "test_env"])[METHOD_COLUMNS]

    return _per_dataset(records, one)


def _held_out_at_every_checkpoint(singles: pd.DataFrame) -> pd.DataFrame:
    """The single runs whose held-out `in` split was evaluated at every checkpoint that has a
    validation accuracy: leave-one-domain-out may select any of them. A run evaluated with `--eval_splits final` outside a sweep with its pair
    runs holds it at two checkpoints only; it is left out (its cell goes missing, never wrong)."""
    partial = singles.groupby("run")["test_acc"].transform(lambda acc: acc.isna().any())
    if partial.any():
        log.warning("leave-one-domain-out leaves out %d single runs whose held-out split was evaluated only at "
                    "the end (--eval_splits final); a sweep that holds out pairs evaluates its single runs at "
                    "every checkpoint", singles.loc[partial, "run"].nunique())
    return singles[~partial]


@register_selection_method("oracle", "test-domain validation (oracle)", default=True, held_out_validation=True)
def oracle_test_domain_validation(records: pd.DataFrame) -> pd.DataFrame:
    """Oracle: the last checkpoint only (no early stopping); validation is the test env's `out` accuracy."""

    def one(sub: pd.DataFrame, n_envs: int) -> pd.DataFrame:
        sub = _with_defaults(_single_test_env_records(sub))
        if sub.empty:
            return sub
        last = _last_checkpoints(sub)
        last["val_acc"] = _test_acc(last, "out", n_envs)
        last["test_acc"] = _test_acc(last, "in", n_envs)
        last["indomain_acc"] = _in_domain_acc(last, "out", n_envs)
        return _single_candidates(last)[METHOD_COLUMNS]

    return _per_dataset(records, one)


@register_selection_method("last", "no selection: final checkpoint, fixed hyperparameters", searches_hparams=False,
                           in_domain_split="in")
def final_checkpoint(records: pd.DataFrame) -> pd.DataFrame:
    """No model selection (the IRM paper's protocol): every run's last checkpoint.

    val_acc is constant, so `select` keeps the smallest hparams_seed (hyperparameters
    are fixed, not searched); indomain_acc is the mean `in` (training) accuracy over
    the training environments, the paper's "train accuracy".
    """

    def one(sub: pd.DataFrame, n_envs: int) -> pd.DataFrame:
        sub = _with_defaults(_single_test_env_records(sub))
        if sub.empty:
            return sub
        last = _last_checkpoints(sub)
        last["val_acc"] = 0.0
        last["test_acc"] = _test_acc(last, "in", n_envs)
        last["indomain_acc"] = _in_domain_acc(last, "in", n_envs)
        # nothing is selected: no candidates to tie
        return last.assign(candidates=0, val_min=last["val_acc"])[METHOD_COLUMNS]

    return _per_dataset(records, one)


def check_hparams_choice(hparams_choice: str) -> None:
    """Raise a one-line DomaingenError for an unknown hparams choice."""
    if hparams_choice not in HPARAMS_CHOICES:
        raise DomaingenError(
            f"unknown --hparams_choice {hparams_choice!r}; choose one of {', '.join(HPARAMS_CHOICES)}"
        )


def _per_trial(per_run: pd.DataFrame, smallest_seed_wins: bool) -> pd.DataFrame:
    ordered = per_run.sort_values(
        ["val_acc", "hparams_seed"], ascending=[False, smallest_seed_wins], kind="stable"
    )
    return ordered.drop_duplicates(["dataset", "algorithm", "test_env", "trial_seed"], keep="first")


def _pooled(per_run: pd.DataFrame) -> pd.DataFrame:
    cell = ["dataset", "algorithm", "test_env"]
    means = per_run.groupby(cell + ["hparams_seed"], as_index=False)["val_acc"].mean()
    best = means.sort_values(["val_acc", "hparams_seed"], ascending=[False, True], kind="stable")
    best = best.drop_duplicates(cell, keep="first")
    return per_run.merge(best[cell + ["hparams_seed"]], how="inner")


def _ties(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, algorithm, test_env, trial_seed): True when two or more candidates (every
    checkpoint of every draw) were compared and all had the same validation accuracy."""
    trial = ["dataset", "algorithm", "test_env", "trial_seed"]
    grouped = per_run.groupby(trial, as_index=False).agg(
        candidates=("candidates", "sum"), best=("val_acc", "max"), lowest=("val_min", "min")
    )
    grouped["tied"] = (grouped["candidates"] >= 2) & (grouped["lowest"] == grouped["best"])
    return grouped[trial + ["tied"]]


def _as_method_frame(entry: SelectionMethod, frame: pd.DataFrame) -> pd.DataFrame:
    """A method's output with METHOD_COLUMNS: a method that leaves out run and hparams, or the
    candidate columns, kept one checkpoint per run (a plugin's method, typically)."""
    if frame.empty:
        return pd.DataFrame(columns=METHOD_COLUMNS)
    missing = [c for c in RUN_COLUMNS + ["step", "val_acc", "test_acc", "indomain_acc"] if c not in frame.columns]
    if missing:
        raise DomaingenError(f"selection method '{entry.name}' ({owner(entry)}) returned no column {', '.join(missing)}; "
                             "it returns one row per run with those (see selection.scored_checkpoints)")
    frame = _with_defaults(frame)
    if not all(c in frame.columns for c in CANDIDATE_COLUMNS):
        frame = _single_candidates(frame)
    return frame[METHOD_COLUMNS]


def selected_per_run(records: pd.DataFrame, method: str) -> pd.DataFrame:
    """Per run (per group of runs, for leave-one-domain-out), the checkpoint `method` picks within
    it, before any choice between hparams draws: one row per (dataset, algorithm, test_env,
    hparams_seed, trial_seed) with METHOD_COLUMNS; runs whose pick has no validation accuracy are
    left out."""
    entry = SELECTION_METHODS.get(method)
    per_run = _as_method_frame(entry, entry.select(records))
    # a checkpoint without a validation accuracy (a test-time mode undefined on the validation
    # split, e.g. known-domain on the test env under oracle selection) cannot be selected
    per_run = per_run[per_run["val_acc"].notna()]
    if per_run.empty:
        return per_run
    return per_run.astype({"hparams_seed": int, "trial_seed": int, "test_env": int})


def select(records: pd.DataFrame, method: str, hparams_choice: str = "per_trial") -> pd.DataFrame:
    """The selected checkpoint per (dataset, algorithm, test_env, trial_seed), in that order.

    Columns: SELECTED_COLUMNS (val_acc, test_acc, indomain_acc, the run directory's
    name and the hyperparameters as JSON, besides the keys; `tied`: every candidate of
    that trial validated the same, see the module docstring). `hparams_choice` is
    "per_trial" (DomainBed's rule, the default) or "pooled"; see the module docstring.
    """
    check_hparams_choice(hparams_choice)
    entry = SELECTION_METHODS.get(method)
    per_run = selected_per_run(records, method)
    if per_run.empty:
        return per_run.assign(tied=pd.Series(dtype=bool))[SELECTED_COLUMNS]
    if hparams_choice == "pooled":
        chosen = _pooled(per_run)
    else:
        chosen = _per_trial(per_run, smallest_seed_wins=not entry.searches_hparams)
    chosen = chosen.merge(_ties(per_run), on=["dataset", "algorithm", "test_env", "trial_seed"], how="left")
    order = ["dataset", "algorithm", "test_env", "trial_seed", "hparams_seed"]
    return chosen.sort_values(order, kind="stable").reset_index(drop=True)[SELECTED_COLUMNS]
