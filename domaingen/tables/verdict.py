"""A published claim of a gain, set against our runs: `domaingen collect verdict`.

A claims file (shipped: `published/modreg_claims.csv`; or any CSV with the same columns) names
per claim a dataset, a held-out environment, the featurizer the paper used, a base algorithm, the
method that claims to improve on it, the two published accuracies, the selection rule our runs
are read with, and where the numbers are published; an optional `compare` column names other
datasets with the same environments (`|`-separated: the same images under another protocol). For
each claim, over the runs of that dataset whose featurizer is the claim's:

- the method's points: every row of the method in the tables (`ALGORITHM`, or with `--split_by`
  `ALGORITHM (hparam=value, ...)`: the defaults and each grid point), each paired with the base
  algorithm trial by trial (same trial_seed: same initial weights, splits and minibatches),
  the differences' mean, their 95% t-interval and a paired test, Holm-adjusted over the points that
  have one (a point with a single paired trial has none and does not count; the table's `tested`).
  The test is the paired t-test (DEFAULT_TEST), the test whose interval the verdict reads: with n
  pairs an exact signed-rank (or any sign-flip) test cannot give p below 2 / 2^n, and Holm multiplies
  that floor by the number of tested points, so under it a grid of 26 points at ten restarts could
  never reject. `test` "wilcoxon" (or "auto", statistics.paired_test's rule) judges with it all the same;
- the best point: the one with the highest mean difference. It is chosen on test accuracy, the
  choice most favourable to the method: a claim that fails even there fails everywhere, and the
  Holm adjustment over every tested point pays for the choice when a gain is found;
- collapse: how many of the best point's selected runs are within COLLAPSE_MARGIN of chance on
  their own training environments (collect's `train_collapsed`; at a checkpoint that did not
  evaluate those, on their validation splits), where a held-out score can read as a gain (a model
  at chance scores 50% on Colored MNIST's -90% environment);
- the verdict, by RULE.

Where a paper's protocol cannot be identified (its base scores match no protocol we know), the
base's score under every protocol tried tells which one the paper's numbers resemble:
`protocol_frame` lists the base algorithm, per claim, on the claim's dataset and on each dataset
of its `compare` column, one row per featurizer, protocol and training length found in the runs.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats
from tabulate import tabulate

from domaingen.errors import DomaingenError
from domaingen.tables.collect import COLLAPSED, OUT_ACC_FIELD, Collection, training_accuracy
from domaingen.tables.comparisons import paired_cell
from domaingen.tables.reference import AVG, PUBLISHED_DIR, _environment, _number
from domaingen.tables.reporting import Cell, build_tables
from domaingen.tables.selection import selection_method_names
from domaingen.tables.statistics import ALPHA, TEST_NAMES, WILCOXON_MIN_N, check_paired_test, holm

COLUMNS = ("claim", "dataset", "test_env", "featurizer", "base", "method", "base_mean", "method_mean", "selection",
           "source")
OPTIONAL_COLUMNS = ("compare",)
LEVEL = 0.95  # the t-interval's coverage
DEFAULT_TEST = "t"  # the test of the t-interval the rule reads; no floor on p under Holm (see the docstring)

REPRODUCED = "reproduced"
SMALLER = "smaller gain"
REFUTED = "refuted"
INCONCLUSIVE = "inconclusive"
OPEN = "open"
UNTESTABLE = "untestable here"
COLLAPSED_GAIN = "gain from collapsed runs"

RULE = (f"Verdicts: '{REPRODUCED}' when some point's gain over the base is positive with a Holm-adjusted p below "
        f"{ALPHA:g} (over every point tried that has a test: two or more paired trials, not all equal) and "
        f"the best point's {LEVEL:.0%} interval reaches the claimed gain; "
        f"'{SMALLER}' when such a gain is found but the best point's interval lies below the claimed gain; "
        f"'{REFUTED}' when no point gains significantly and the best point's interval lies below the claimed gain; "
        f"'{INCONCLUSIVE}' when no point gains significantly and the interval still reaches the claimed gain. "
        f"'{REFUTED}' and '{SMALLER}' need both the defaults and at least one other grid point tried, else the "
        f"verdict is '{OPEN}', as it is while the base or the method has not been run; '{UNTESTABLE}' when the "
        f"claim's dataset is not one domaingen has; '{COLLAPSED_GAIN}' in place of '{REPRODUCED}', '{SMALLER}' or "
        f"'{INCONCLUSIVE}' when the best point gains and any of its selected runs collapsed (a network at chance "
        f"on its own training environments is not credited with a held-out score). The best point is chosen on "
        f"test accuracy, the choice most favourable to the method.")


@dataclass(frozen=True)
class Claim:
    """One published gain: `method` over `base` on `dataset` with `test_env` held out (accuracies in percent)."""

    name: str
    dataset: str
    test_env: str
    featurizers: tuple[str, ...]
    base: str
    method: str
    base_mean: float
    method_mean: float
    selection: str
    source: str
    compare: tuple[str, ...] = ()

    @property
    def gain(self) -> float:
        return self.method_mean - self.base_mean


@dataclass
class Point:
    """One row of the method against the base: the paired differences (fractions) and their statistics."""

    name: str
    differences: list[float]
    p_value: float = math.nan
    p_holm: float = math.nan
    collapsed: int = 0
    method_cell: Cell = field(default_factory=Cell)

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def mean(self) -> float:
        return float(np.mean(self.differences)) if self.differences else math.nan

    def interval(self) -> tuple[float, float]:
        """The t-interval of the mean difference at LEVEL; NaN with fewer than two pairs."""
        if self.n < 2:
            return math.nan, math.nan
        half = stats.t.ppf(0.5 + LEVEL / 2, self.n - 1) * np.std(self.differences, ddof=1) / math.sqrt(self.n)
        return self.mean - half, self.mean + half


@dataclass
class Verdict:
    claim: Claim
    verdict: str
    reason: str = ""
    base_cell: Cell = field(default_factory=Cell)
    defaults: Point | None = None
    best: Point | None = None
    points: list[Point] = field(default_factory=list)

    @property
    def tested(self) -> int:
        """How many points have a paired test: the family Holm's adjustment runs over."""
        return sum(not math.isnan(p.p_value) for p in self.points)


def claims_path(name: str | os.PathLike) -> Path:
    path = Path(name)
    if path.suffix == ".csv" or path.exists():
        return path
    shipped = PUBLISHED_DIR / f"{name}.csv"
    if shipped.exists():
        return shipped
    shipped_names = ", ".join(sorted(p.stem for p in PUBLISHED_DIR.glob("*_claims.csv")))
    raise DomaingenError(f"claims {name}: no such file and no shipped claims file of that name (shipped: {shipped_names})")


def read_claims(name: str | os.PathLike) -> list[Claim]:
    """The claims of a CSV with COLUMNS (a path, or the name of a shipped file); one line per mistake."""
    path = claims_path(name)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise DomaingenError(f"claims file {path} not found") from None
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError):
        raise DomaingenError(f"claims file {path} is not a CSV with the columns {', '.join(COLUMNS)}") from None
    frame.columns = [c.strip() for c in frame.columns]
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise DomaingenError(f"claims file {path} lacks the column(s) {', '.join(missing)}; it needs {', '.join(COLUMNS)}")
    claims = []
    for i, row in enumerate(frame.to_dict("records")):
        row = {k: str(v).strip() for k, v in row.items()}
        where = f"claims file {path} line {i + 2}"
        if row["selection"] not in selection_method_names():
            raise DomaingenError(f"{where}: selection {row['selection']!r} is not one of {', '.join(selection_method_names())}")
        if not row["source"]:
            raise DomaingenError(f"{where}: the source is empty; name where the numbers are published")
        compare = tuple(d.strip() for d in row.get("compare", "").split("|") if d.strip())
        test_env = _environment(row["dataset"], row["test_env"], where)
        for other in compare:
            if _environment(other, test_env, where) != test_env:
                raise DomaingenError(f"{where}: compare dataset {other} has no environment {test_env}")
        claims.append(Claim(row["claim"], row["dataset"], test_env,
                            tuple(f.strip() for f in row["featurizer"].split("|") if f.strip()), row["base"],
                            row["method"], _number(row["base_mean"], "base_mean", where, True),
                            _number(row["method_mean"], "method_mean", where, True), row["selection"], row["source"],
                            compare))
    return claims


def read_claims_files(names: Sequence[str | os.PathLike]) -> list[Claim]:
    """The claims of several files (paths or shipped names), in order."""
    return [claim for name in names for claim in read_claims(name)]


def _featurizer(hparams: str) -> str:
    """A run's featurizer; one whose hparams do not name it used the default, `auto`."""
    return str(json.loads(hparams).get("featurizer", "auto"))


def claim_records(collection: Collection, claim: Claim) -> Collection:
    """The collection narrowed to the claim's dataset and featurizers (runs and records alike)."""
    records = collection.records
    if records.empty:
        return Collection(records)
    keep = (records["dataset"] == claim.dataset) & records["hparams"].map(_featurizer).isin(claim.featurizers)
    mine = records[keep]
    runs = collection.runs
    if len(runs) and "run" in runs:
        runs = runs[runs["run"].isin(set(mine["run"]))]
    return Collection(mine, runs=runs, protocol=collection.protocol)


def _collapsed(records: pd.DataFrame, cell: Cell) -> int:
    """How many of the cell's selected runs collapsed: COLLAPSED at the selected step; where that step
    did not evaluate the training splits, the same test on its training environments' out (validation)
    splits; where it evaluated neither, COLLAPSED at the run's last step that did. A trial of an
    average over held-out environments (`trial_average`) counts once if any of its runs collapsed."""
    if COLLAPSED not in records:
        return 0
    flagged = records[records[COLLAPSED].notna()].sort_values("step")
    at_step = flagged.set_index(["run", "step"])[COLLAPSED]
    last = flagged.groupby("run")[COLLAPSED].last()
    rows = {(row["run"], row["step"]): row for row in records.to_dict("records")}

    def collapsed_at(run: str, step: int) -> float | None:
        if (run, step) in at_step:
            return at_step[(run, step)]
        row = rows.get((run, step))
        on_validation = training_accuracy(row, row["test_envs"], row["dataset"], OUT_ACC_FIELD) if row else {}
        return on_validation.get(COLLAPSED, last.get(run))

    count = 0
    for t in cell.trace:
        values = [collapsed_at(run, step) for run, step in t.get("parts", [(t["run"], t["step"])])]
        count += any(bool(v) for v in values if v is not None)
    return count


def trial_average(cells: Sequence[Cell]) -> Cell:
    """Per trial_seed found in every cell (one per held-out environment), the mean of its values: the
    average over environments as a per-trial quantity, so that two algorithms' averages pair by trial.
    (The tables' Avg cell averages the environments' means, which equals these values' mean when every
    environment has every trial, but carries no trials to pair.)"""
    by_trial = [{t["trial_seed"]: (v, t) for v, t in zip(c.values, c.trace)} for c in cells]
    common = [seed for seed in (by_trial[0] if by_trial else {}) if all(seed in b for b in by_trial[1:])]
    values, trace = [], []
    for seed in common:
        parts = [b[seed] for b in by_trial]
        values.append(float(np.mean([v for v, _ in parts])))
        trace.append({"trial_seed": seed, "hparams_seed": "/".join(str(t["hparams_seed"]) for _, t in parts),
                      "step": "/".join(str(t["step"]) for _, t in parts),
                      "run": "/".join(str(t["run"]) for _, t in parts),
                      "parts": [(t["run"], t["step"]) for _, t in parts]})
    return Cell(values, trace=trace) if values else Cell(missing="no trial holds out every environment")


def _column_cell(table, row: str, test_env: str) -> Cell:
    """The row's cell of one held-out environment, or its per-trial average over them all (test_env Avg)."""
    cells = table.rows[row]
    if test_env != AVG:
        return cells[table.columns.index(test_env)]
    return trial_average([cells[i] for i, column in enumerate(table.columns) if column != AVG])


def is_method_row(row: str, method: str) -> bool:
    """Whether a table row is the method: its name, or its name with split hyperparameters in brackets."""
    return row == method or (row.startswith(method + " (") and row.endswith(")"))


def judge(claim: Claim, collection: Collection, defaults: Mapping[str, str] | None = None,
          test: str = DEFAULT_TEST) -> Verdict:
    """The claim's verdict over `collection` (see the module docstring and RULE); `test`, one of
    PAIRED_TESTS, is each point's paired test.

    `defaults` maps a method row to whether it is the defaults: by default the row named exactly
    `claim.method`, or, with split hyperparameters, the row whose values are the method's defaults
    as `default_rows` found them."""
    from domaingen.datasets import DATASETS

    if claim.dataset not in DATASETS:
        return Verdict(claim, UNTESTABLE, f"domaingen has no dataset {claim.dataset}")
    mine = claim_records(collection, claim)
    if mine.records.empty:
        return Verdict(claim, OPEN, f"no run of {claim.dataset} with featurizer {' or '.join(claim.featurizers)} yet")
    tables = [t for t in build_tables(mine, [claim.selection])
              if t.key == f"{claim.dataset}/{claim.selection}/test"]
    if not tables or claim.test_env not in tables[0].columns:
        return Verdict(claim, OPEN, f"no run with {claim.test_env} held out yet")
    table = tables[0]
    if claim.base not in table.rows or not _column_cell(table, claim.base, claim.test_env).values:
        return Verdict(claim, OPEN, f"no {claim.base} run yet")
    base = _column_cell(table, claim.base, claim.test_env)
    points = []
    for row in table.rows:
        cell = _column_cell(table, row, claim.test_env) if is_method_row(row, claim.method) else Cell()
        if not cell.values:
            continue
        paired = paired_cell(cell, base, test=True, kind=test)
        if not paired.values:  # no trial in common with the base: nothing to pair
            continue
        points.append(Point(row, list(paired.values), paired.p_value, collapsed=_collapsed(mine.records, cell),
                            method_cell=cell))
    if not points:
        return Verdict(claim, OPEN, f"no {claim.method} run that shares a trial_seed with {claim.base} yet", base)
    for point, adjusted in zip(points, holm([p.p_value for p in points])):
        point.p_holm = adjusted
    default_names = set((defaults or {}).get(claim.method, [claim.method]))
    default = next((p for p in points if p.name in default_names), None)
    best = max(points, key=lambda p: p.mean)
    verdict = Verdict(claim, "", "", base, default, best, points)
    gain = claim.gain / 100
    significant = any(p.mean > 0 and p.p_holm < ALPHA for p in points)
    high = best.interval()[1]
    reaches = math.isnan(high) or high >= gain
    if significant:
        verdict.verdict = REPRODUCED if reaches else SMALLER
    else:
        verdict.verdict = INCONCLUSIVE if reaches else REFUTED
    if verdict.verdict in (REPRODUCED, SMALLER, INCONCLUSIVE) and best.mean > 0 and best.collapsed:
        verdict.reason = (f"{best.collapsed} of {best.n} of the best point's selected runs are at chance on their own "
                          f"training environments")
        verdict.verdict = COLLAPSED_GAIN
        return verdict
    if verdict.verdict in (REFUTED, SMALLER) and (default is None or len(points) < 2):
        verdict.reason = (f"would be '{verdict.verdict}', but " +
                          ("the defaults were not run" if default is None else "no grid point beside the defaults was run"))
        verdict.verdict = OPEN
    return verdict


def parse_equivalents(specs: Sequence[str], split_by: Sequence[str]) -> dict[str, object]:
    """`HPARAM=VALUE` strings (VALUE in JSON; a bare word is a string) as a dict; one line per mistake.
    Every HPARAM must be one of `split_by`."""
    values: dict[str, object] = {}
    for spec in specs:
        key, sep, text = spec.partition("=")
        if not sep or not key or not text:
            raise DomaingenError(f"--defaults takes HPARAM=VALUE (e.g. modreg_scale=0.1), got {spec!r}")
        if key not in split_by:
            raise DomaingenError(f"--defaults {key}: not among --split_by ({', '.join(split_by) or 'none given'})")
        try:
            values[key] = json.loads(text)
        except json.JSONDecodeError:
            values[key] = text
    return values


def default_rows(claims: Sequence[Claim], split_by: Sequence[str],
                 equivalents: Mapping[str, object] | None = None) -> dict[str, list[str]]:
    """Per method of the claims, the rows that stand for its defaults under `split_by` (collect's
    split names: `METHOD (key=value, ...)` with json-encoded values): the row of the registry's
    defaults on the claim's dataset and, with `equivalents`, the row with those values in place
    (a grid point that runs the defaults under other names, e.g. ModReg's scale 0.1 x alpha 10x)."""
    from domaingen.algorithms import ALGORITHMS
    from domaingen.datasets import DATASETS
    from domaingen.hparams import run_space

    names: dict[str, list[str]] = {}
    for claim in claims:
        rows = names.setdefault(claim.method, [])
        if not split_by:
            rows += [claim.method] * (claim.method not in rows)
            continue
        space = run_space(claim.dataset, DATASETS.get(claim.dataset), ALGORITHMS.get(claim.method))
        defaults = {k: space[k].default for k in split_by if k in space}
        for values in (defaults, {**defaults, **(equivalents or {})} if equivalents else None):
            if values is None:
                continue
            text = ", ".join(f"{k}={json.dumps(values[k])}" for k in split_by if k in values)
            name = f"{claim.method} ({text})" if text else claim.method
            rows += [name] * (name not in rows)
    return names


def judge_sources(claims: Sequence[Claim], sources: Sequence[tuple[str, Collection]], split_by: Sequence[str] = (),
                  equivalents: Mapping[str, object] | None = None,
                  test: str = DEFAULT_TEST) -> tuple[list[Verdict], pd.DataFrame | None]:
    """Every claim judged on labelled collections (each point's paired test: `test`), and the
    protocols table (None when it is empty).

    Sources of one protocol merge; sources of different protocols stay apart, and each claim is judged
    within the first protocol whose runs hold its dataset with its featurizer, else its dataset (so a
    paired grid and a DomainBed-protocol sweep never share a table, and a CNN sweep of one protocol does
    not hide an MLP sweep of another on the same dataset). `split_by` splits each protocol's rows by
    those hyperparameters where its runs have them; a key no source has raises collect's one-line
    message naming it."""
    from domaingen.tables.collect import merged, split_by_hparams

    by_protocol: dict[str, list[tuple[str, Collection]]] = {}
    for label, collection in sources:
        by_protocol.setdefault(collection.protocol, []).append((label, collection))
    groups = [parts[0][1] if len(parts) == 1 else merged(parts, label_algorithms=False)
              for parts in by_protocol.values()]
    frames = [frame for frame in (protocol_frame(claims, group) for group in groups) if len(frame)]
    protocols = pd.concat(frames, ignore_index=True) if frames else None
    if split_by:
        present = [{k for h in g.records["hparams"].unique() for k in json.loads(h)} if len(g.records) else set()
                   for g in groups]
        for key in split_by:
            if not any(key in keys for keys in present):
                split_by_hparams(groups[0], [key])  # raises the one-line message naming the key
        groups = [split_by_hparams(g, [k for k in split_by if k in keys]) if keys & set(split_by) else g
                  for g, keys in zip(groups, present)]
    defaults = default_rows(claims, split_by, equivalents)

    def group_of(claim: Claim) -> Collection:
        # the first protocol with runs of the claim's dataset and featurizer; failing that, of its dataset
        holding = [g for g in groups if len(g.records) and (g.records["dataset"] == claim.dataset).any()]
        return next((g for g in holding if len(claim_records(g, claim).records)), holding[0] if holding else groups[0])

    return [judge(claim, group_of(claim), defaults, test) for claim in claims], protocols


def _base_cell(collection: Collection, dataset: str, selection: str, base: str, test_env: str) -> Cell | None:
    tables = [t for t in build_tables(collection, [selection]) if t.key == f"{dataset}/{selection}/test"]
    if not tables or test_env not in tables[0].columns or base not in tables[0].rows:
        return None
    cell = _column_cell(tables[0], base, test_env)
    return cell if cell.values else None


def _mean_interval(values: Sequence[float]) -> str:
    """mean [95% t-interval] (n) in percent; the interval needs two values."""
    mean = 100 * float(np.mean(values))
    if len(values) < 2:
        return f"{mean:.1f} (n=1)"
    half = 100 * stats.t.ppf(0.5 + LEVEL / 2, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values))
    return f"{mean:.1f} [{mean - half:.1f}, {mean + half:.1f}] (n={len(values)})"


def protocol_frame(claims: Sequence[Claim], collection: Collection) -> pd.DataFrame:
    """Per claim, its base algorithm on the claim's dataset and on each `compare` dataset, one row per
    featurizer, protocol and last recorded step, at the claim's held-out environment (or their per-trial
    average); read with the claim's selection, or with `last` where that selection finds nothing (no
    validation data). Claims that share the base, dataset, held-out environment, selection and paper
    number share their rows (listed under the first); a claim whose paper number differs (an MLP and a
    CNN row of one dataset) gets its own, so each row's paper column is the number it is compared with."""
    records = collection.records
    rows = []
    seen = set()
    for claim in claims:
        key = (claim.base, claim.dataset, claim.test_env, claim.selection, claim.base_mean)
        if key in seen or records.empty:
            continue
        seen.add(key)
        for dataset in (claim.dataset, *claim.compare):
            mine = records[(records["dataset"] == dataset) & (records["algorithm"] == claim.base)]
            if mine.empty:
                continue
            mine = mine.assign(_featurizer=mine["hparams"].map(_featurizer).replace("", "auto"),
                               _last=mine.groupby("run")["step"].transform("max"))
            for (featurizer, protocol, last), group in mine.groupby(["_featurizer", "protocol", "_last"], sort=True):
                part = Collection(group.drop(columns=["_featurizer", "_last"]), protocol=collection.protocol)
                cell, used = _base_cell(part, dataset, claim.selection, claim.base, claim.test_env), claim.selection
                if cell is None and claim.selection != "last":
                    cell, used = _base_cell(part, dataset, "last", claim.base, claim.test_env), "last"
                if cell is None:
                    continue
                rows.append({"claim": claim.name, "base": claim.base, "paper": f"{claim.base_mean:g}",
                             "dataset": dataset, "featurizer": featurizer, "protocol": protocol,
                             "last step": int(last), "selection": used, "ours [95% CI]": _mean_interval(cell.values)})
    return pd.DataFrame(rows)


def _pct(x: float, digits: int = 1) -> str:
    return "—" if math.isnan(x) else f"{100 * x:+.{digits}f}"


def _point_text(point: Point | None) -> str:
    if point is None:
        return "not run"
    low, high = point.interval()
    interval = "" if math.isnan(low) else f" [{_pct(low)}, {_pct(high)}]"
    p = "" if math.isnan(point.p_holm) else f", p={point.p_holm:.2g}"
    collapsed = f", {point.collapsed} of {point.n} collapsed" if point.collapsed else ""
    return f"{_pct(point.mean)}{interval} (n={point.n}{p}{collapsed})"


def _best_name(verdict: Verdict) -> str:
    if verdict.best is None:
        return "—"
    name = verdict.best.name
    inner = name[len(verdict.claim.method):].strip()
    return inner[1:-1] if inner.startswith("(") else "defaults"


def verdict_frame(verdicts: Sequence[Verdict]) -> pd.DataFrame:
    """One row per claim: the published numbers, ours, the defaults' and the best point's gains, the verdict."""
    rows = []
    for v in verdicts:
        c = v.claim
        ours_base = f"{100 * v.base_cell.mean:.1f}" if v.base_cell.values else "—"
        ours_method = f"{100 * v.best.method_cell.mean:.1f}" if v.best is not None else "—"
        rows.append({
            "claim": c.name,
            "paper: base → method (gain)": f"{c.base_mean:g} → {c.method_mean:g} ({c.gain:+.2f})",
            "ours: base → best method": f"{ours_base} → {ours_method}",
            "defaults: gain [95% CI]": _point_text(v.defaults) if v.best is not None else "—",
            "best point": _best_name(v),
            "best: gain [95% CI]": _point_text(v.best),
            "points": len(v.points),
            "tested": v.tested,
            "verdict": v.verdict + (f" ({v.reason})" if v.reason else ""),
        })
    return pd.DataFrame(rows)


def test_text(test: str) -> str:
    """What the verdict's p is, for its footnote."""
    check_paired_test(test)
    name = (f"{TEST_NAMES['t']} with fewer than {WILCOXON_MIN_N} pairs, else the {TEST_NAMES['wilcoxon']}"
            if test == "auto" else TEST_NAMES[test])
    floor = ("" if test == "t" else
             "; with n pairs the signed-rank test's p is at least 2/2^n before Holm's multiplier")
    return f"p: {name}, Holm-adjusted over the claim's tested points{floor}"


def verdict_markdown(verdicts: Sequence[Verdict], protocols: pd.DataFrame | None = None,
                     test: str = DEFAULT_TEST, also: tuple[str, Sequence[Verdict]] | None = None) -> str:
    """The verdicts as Markdown: one table per selection rule, the base under each protocol tried
    (`protocol_frame`, when given), with `also` (another test and the verdicts judged with it) a
    table of the verdicts under that test, then the rule, what p is (`test`, the paired test the
    verdicts were judged with) and where the numbers are from."""
    frame = verdict_frame(verdicts)
    selections = [v.claim.selection for v in verdicts]
    lines = []
    for selection in dict.fromkeys(selections):
        rows = [i for i, s in enumerate(selections) if s == selection]
        lines += [f"### Claims read with selection {selection}: gains in points, method minus base paired by trial", "",
                  tabulate(frame.iloc[rows], headers="keys", tablefmt="github", showindex=False), ""]
    if protocols is not None and len(protocols):
        lines += ["### The base under each protocol tried (held-out accuracy, percent)", "",
                  tabulate(protocols, headers="keys", tablefmt="github", showindex=False), ""]
    if also is not None:
        other, judged = also
        # judged with the same claims, in the same order
        rows = [{"claim": v.claim.name, "selection": v.claim.selection, "best point": _best_name(v),
                 "best: gain [95% CI]": _point_text(v.best), "tested": v.tested,
                 "verdict": v.verdict + (f" ({v.reason})" if v.reason else ""),
                 f"as with {test}": "yes" if mine.verdict == v.verdict else "no"}
                for mine, v in zip(verdicts, judged)]
        lines += [f"### The same claims judged with another test, {other} ({test_text(other)})", "",
                  tabulate(pd.DataFrame(rows), headers="keys", tablefmt="github", showindex=False), ""]
    sources = sorted({v.claim.source for v in verdicts})
    lines.append(f"Published numbers: {'; '.join(sources)}. " + RULE +
                 f" Intervals: Student's t at {LEVEL:.0%} over the paired trials; {test_text(test)} (a point with a "
                 "single paired trial, or with no spread, has no test). Collapsed: a selected run "
                 "within 5 points of chance on its own training environments.")
    return "\n".join(lines) + "\n"


def verdict_csv(verdicts: Sequence[Verdict], test: str = DEFAULT_TEST,
                also: tuple[str, Sequence[Verdict]] | None = None) -> str:
    """The verdicts as CSV, verdict_frame's columns and `test`, the paired test behind each p; with
    `also` (another test and the verdicts judged with it), those verdicts' rows follow."""
    parts = [(test, verdicts)] + ([also] if also is not None else [])
    for name, _ in parts:
        check_paired_test(name)
    return pd.concat([verdict_frame(v).assign(test=name) for name, v in parts], ignore_index=True).to_csv(index=False)
