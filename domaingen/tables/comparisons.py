"""Tables derived from the selected runs of `collect`'s test tables.

- Paired differences (`collect --paired`): algorithm A minus algorithm B, trial by
  trial. X and X+ModReg share their training seed at a trial (same initial weights,
  same minibatches), so the difference of their selected test accuracies at one
  trial_seed removes the restart's own noise; the cell is the mean ± error over
  trials of those differences, says in how many trials A was lower, and gives the
  Holm-adjusted p of a paired test of the differences (tables.statistics; the title
  names the test; a cell with fewer than two pairs says in its footnote why it has none).
  Over hyperparameter draws (`--paired_over draws`, protocol `paired` only, where draw k of
  A and of B share their common values): every run of every draw, each at the checkpoint
  the selection method picks within it, paired by (hparams_seed, trial_seed).
- Record fields at the selected checkpoint (`collect --fields GLOB`): any number a
  run records (ModReg's kept fraction per layer, DMG's IoU, a penalty), read from
  the record of each trial's selected run and step, mean ± error over trials.
- Two sweeps against each other (`collect versus --other DIR`): each algorithm's cells in
  both and their difference trial by trial, with what the twin runs' arguments differ in.
"""

from __future__ import annotations

import fnmatch
import json
import math
from typing import Sequence

import pandas as pd

from domaingen.errors import DomaingenError
from domaingen.run.protocol import DOMAINBED
from domaingen.tables.collect import Collection, n_environments, table_records
from domaingen.tables.reporting import Cell, Table, environment_names, held_out_environments, row_order
from domaingen.tables.selection import HPARAMS_CHOICE_TITLES, selected_per_run
from domaingen.tables.statistics import WILCOXON_MIN_N, holm, paired_test

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


def baseline_pairs(tables: Sequence[Table], baseline: str) -> list[tuple[str, str]]:
    """(A, baseline) for every other algorithm A of the test tables (`collect --baseline`); one line
    listing the algorithms the tables have when `baseline` is none of them."""
    everywhere = sorted({a for t in _test_tables(tables) for a in t.rows}, key=row_order)
    if baseline not in everywhere:
        raise DomaingenError(f"--baseline {baseline} is in no table; the tables have: {', '.join(everywhere) or 'none'}")
    return [(a, baseline) for a in everywhere if a != baseline]


PAIRED_OVER = ("trials", "draws")
# what a pair is under each PAIRED_OVER choice: the trace keys it matches on, and its name in notes
PAIR_KEYS = {"trials": ("trial_seed",), "draws": ("hparams_seed", "trial_seed")}
PAIR_NAMES = {"trials": "trials", "draws": "pairs"}
PAIRED_OVER_CAPTIONS = {"trials": " (same trial_seed)",
                        "draws": ", paired over hyperparameter draws and trials (same hparams_seed and trial_seed)"}


def paired_cell(a: Cell, b: Cell, test: bool = False, over: str = "trials", kind: str = "auto") -> Cell:
    """A minus B over the pairs both have, in A's trace order.

    `over` "trials": a cell's values are its selected trials, paired by trial_seed; "draws": every
    run of every hparams draw (draw_cells), paired by (hparams_seed, trial_seed).
    With `test`, the differences' paired test (statistics.paired_test, of `kind`) fills the cell's
    test and p_value, or its footnote says why no test could be made; `holm_adjust` fills p_holm."""
    if not a.values or not b.values:
        return Cell(missing="no runs to pair" if not (a.values or b.values) else "one side has no runs")
    keys = PAIR_KEYS[over]
    many = PAIR_NAMES[over]
    by_key_b = {tuple(t[k] for k in keys): (v, t) for v, t in zip(b.values, b.trace)}
    values, trace = [], []
    for value, t in zip(a.values, a.trace):
        key = tuple(t[k] for k in keys)
        if key in by_key_b:
            other, u = by_key_b[key]
            values.append(value - other)
            if over == "trials":
                trace.append({"trial_seed": t["trial_seed"], "hparams_seed": f"{t['hparams_seed']}-{u['hparams_seed']}",
                              "step": f"{t['step']}-{u['step']}", "run": f"{t['run']}-{u['run']}"})
            else:
                trace.append({"trial_seed": t["trial_seed"], "hparams_seed": t["hparams_seed"],
                              "step": f"{t['step']}-{u['step']}", "run": f"{t['run']}-{u['run']}"})
    if not values:
        return Cell(missing="no trial_seed in common" if over == "trials" else "no (hparams_seed, trial_seed) in common")
    unpaired = len(a.values) + len(b.values) - 2 * len(values)
    note = f"lower in {sum(v < 0 for v in values)} of {len(values)} {many}, higher in {sum(v > 0 for v in values)}"
    note += f"; {unpaired} unpaired {'trial(s)' if over == 'trials' else 'run(s)'} left out" if unpaired else ""
    cell = Cell(values, trace=trace, note=note)
    if test:
        result = paired_test(values, kind)
        reason = result.reason.replace(" paired trial", " pair", 1) if over == "draws" else result.reason
        cell.test, cell.p_value, cell.footnote = result.test, result.p_value, reason
    return cell


def draw_cells(collection: Collection, method: str) -> dict[tuple[str, str, str], Cell]:
    """Per (dataset, algorithm, column of its test table): the test accuracy of every run (every
    hparams draw and trial) at the checkpoint `method` picks within that run
    (selection.selected_per_run), in (hparams_seed, trial_seed) order, with a trace naming each
    run's seeds, step and directory."""
    records = table_records(collection)
    per_run = selected_per_run(records, method)
    if per_run.empty:
        return {}
    per_run = per_run[per_run["test_acc"].notna()]
    cells = {}
    for (dataset, algorithm, env), sub in per_run.groupby(["dataset", "algorithm", "test_env"], sort=True):
        envs = held_out_environments(collection, dataset)
        # the column names of the dataset's test table (reporting.dataset_tables)
        names = environment_names(dataset, max(n_environments(records, dataset), envs[-1] + 1))
        ordered = sub.sort_values(["hparams_seed", "trial_seed"], kind="stable")
        trace = [{"trial_seed": int(r.trial_seed), "hparams_seed": int(r.hparams_seed), "step": int(r.step),
                  "run": str(r.run)} for r in ordered.itertuples()]
        cells[(dataset, algorithm, names[int(env)])] = Cell(ordered["test_acc"].astype(float).tolist(), trace=trace)
    return cells


def holm_adjust(table: Table) -> int:
    """Fill p_holm of every tested cell of `table`, Holm-adjusted over all of them; the number of tests."""
    tested = [c for cells in table.rows.values() for c in cells if c.test]
    for cell, adjusted in zip(tested, holm([c.p_value for c in tested])):
        cell.p_holm = adjusted
    return len(tested)


def test_caption(count: int, over: str = "trials", kind: str = "auto") -> str:
    """What the p of a paired table's cells is (tests of `kind`), for its title."""
    which = {"auto": f"W: Wilcoxon signed-rank, exact, with {WILCOXON_MIN_N} pairs or more; t: paired t-test with "
                     "fewer, where the signed-rank test cannot reach p < 0.05",
             "t": "t: paired t-test, for every n",
             "wilcoxon": "W: Wilcoxon signed-rank, exact, for every n; with n pairs its p is at least 2/2^n"}[kind]
    return (f"p: two-sided paired test of the {'trials' if over == 'trials' else 'pairs'}' differences, Holm-adjusted "
            f"over the table's {count} test{'' if count == 1 else 's'} ({which}); * p < 0.05")


def check_paired_over(over: str, protocol: str) -> None:
    """One line refusing an unknown `over`, or "draws" under a protocol whose draws are not paired."""
    if over not in PAIRED_OVER:
        raise DomaingenError(f"--paired_over is one of {', '.join(PAIRED_OVER)}, not {over!r}")
    if over == "draws" and protocol == DOMAINBED:
        raise DomaingenError("--paired_over draws: under protocol domainbed every trial draws its own "
                             "hyperparameters, so draws do not pair; use --paired_over trials")


def paired_tables(tables: Sequence[Table], pairs: Sequence[tuple[str, str]], over: str = "trials",
                  collection: Collection | None = None, kind: str = "auto") -> list[Table]:
    """Per test table: one row per pair 'A − B', a column per held-out environment, each cell with
    a paired test of `kind` (statistics.PAIRED_TESTS) Holm-adjusted over the table.

    With `pairs` empty, every X+Y beside its X (default_pairs). `over` "trials": the cells pair the
    table's selected trials by trial_seed; "draws": every run of every hparams draw of `collection`
    at the checkpoint the table's selection method picks within it (draw_cells), paired by
    (hparams_seed, trial_seed), which the `paired` protocol shares between algorithms. Raises
    DomaingenError when a named algorithm is in no test table.
    """
    check_paired_over(over, collection.protocol if collection is not None else "")
    if over == "draws" and collection is None:
        raise ValueError("paired_tables over draws needs the collection")
    out = []
    named = {name for pair in pairs for name in pair}
    everywhere = {a for t in _test_tables(tables) for a in t.rows}
    unknown = sorted(named - everywhere)
    if unknown:
        raise DomaingenError(f"--paired names {', '.join(unknown)}, which no table has (algorithms: {', '.join(sorted(everywhere))})")
    by_method: dict[str, dict[tuple[str, str, str], Cell]] = {}
    for table in _test_tables(tables):
        wanted = list(pairs) or default_pairs(list(table.rows))
        wanted = [(a, b) for a, b in wanted if a in table.rows and b in table.rows]
        if not wanted:
            continue
        columns = _env_columns(table)
        dataset, method, _ = table.key.split("/")
        if over == "trials":
            rows = {f"{a} − {b}": [paired_cell(ca, cb, test=True, kind=kind) for ca, cb in zip(table.rows[a], table.rows[b])][: len(columns)]
                    for a, b in wanted}
        else:
            if method not in by_method:
                by_method[method] = draw_cells(collection, method)
            cells = by_method[method]
            none = Cell(missing="no run")
            rows = {f"{a} − {b}": [paired_cell(cells.get((dataset, a, c), none), cells.get((dataset, b, c), none),
                                               test=True, over="draws", kind=kind) for c in columns]
                    for a, b in wanted}
        title = table.title.replace(": test accuracy,", f": paired differences of test accuracy{PAIRED_OVER_CAPTIONS[over]},", 1)
        if over == "draws":  # every draw takes part: no hparams choice applies
            title = title.replace(f", {HPARAMS_CHOICE_TITLES.get(table.hparams_choice, '')}", "")
        paired = Table(title, f"{dataset}/{method}/paired", columns, rows, data_source=table.data_source,
                       hparams_choice=table.hparams_choice, protocol=table.protocol)
        count = holm_adjust(paired)
        paired.title += f"; {test_caption(count, over, kind)}" if count else ""
        out.append(paired)
    if not out and not pairs:
        raise DomaingenError("--paired found no composed algorithm X+Y beside its base X; name pairs as ALGORITHM:BASE")
    return out


def matching_fields(records: pd.DataFrame, patterns: Sequence[str], by_pattern: bool = True) -> list[str]:
    """Numeric record columns matching any glob in `patterns`: in pattern order, then name order
    (`by_pattern`), or in column order. Raises DomaingenError naming the globs and some of the
    fields there are when none matches."""
    numeric = [c for c in records.columns if c not in NOT_FIELDS and pd.api.types.is_numeric_dtype(records[c])]
    if by_pattern:
        found: list[str] = []
        for pattern in patterns:
            found += [c for c in sorted(numeric) if fnmatch.fnmatchcase(c, pattern) and c not in found]
    else:
        found = [c for c in numeric if any(fnmatch.fnmatchcase(c, p) for p in patterns)]
    if not found:
        raise DomaingenError(f"no recorded field matches {' '.join(patterns)} (fields of these runs include: "
                             f"{', '.join(numeric[:8])}{', ...' if len(numeric) > 8 else ''})")
    return found


# `--fields step`: the step of the checkpoint the selection picked (not a record column once indexed)
SELECTED_STEP = "step"


def field_tables(tables: Sequence[Table], records: pd.DataFrame, patterns: Sequence[str]) -> list[Table]:
    """Per test table: rows = algorithms that record a matched field, columns = the matched fields
    (`field @ env` when several environments were held out), cells = the field's value in each
    trial's selected record; the pattern `step` is the selected checkpoint's step. Raises
    DomaingenError naming a pattern that matches no recorded field."""
    fields: list[str] = []
    for pattern in patterns:
        found = [SELECTED_STEP] if pattern == SELECTED_STEP else matching_fields(records, [pattern])
        fields += [f for f in found if f not in fields]
    indexed = records.drop_duplicates(["run", "step"], keep="last").set_index(["run", "step"])
    indexed[SELECTED_STEP] = indexed.index.get_level_values("step")
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
                         hparams_choice=table.hparams_choice, protocol=table.protocol))
    return out


def versus_tables(tables_a: Sequence[Table], tables_b: Sequence[Table], label_a: str, label_b: str) -> list[Table]:
    """`collect versus`: per test table the two sweeps share, and per algorithm both have,
    three rows: A's cell, B's cell, and A minus B paired by trial_seed (`paired_cell`).

    Two sweeps launched with the same seeds and one setting changed (precision, a code
    version, the eval splits) train the same restarts, so the paired difference isolates
    the setting. Raises DomaingenError when they share no table or no algorithm.
    """
    by_key_b = {t.key: t for t in _test_tables(tables_b)}
    shared = [t for t in _test_tables(tables_a) if t.key in by_key_b]
    if not shared:
        def datasets(keys) -> str:
            return ", ".join(sorted({k.split("/")[0] for k in keys})) or "no finished runs"

        raise DomaingenError(f"{label_a} and {label_b} share no dataset to compare ({label_a}: "
                             f"{datasets(t.key for t in _test_tables(tables_a))}; {label_b}: {datasets(by_key_b)})")
    out = []
    for table in shared:
        other = by_key_b[table.key]
        columns = [c for c in _env_columns(table) if c in _env_columns(other)]
        index_a = [table.columns.index(c) for c in columns]
        index_b = [other.columns.index(c) for c in columns]
        rows = {}
        for algorithm in [a for a in table.rows if a in other.rows]:
            cells_a = [table.rows[algorithm][i] for i in index_a]
            cells_b = [other.rows[algorithm][i] for i in index_b]
            rows[f"{algorithm} ({label_a})"] = cells_a
            rows[f"{algorithm} ({label_b})"] = cells_b
            rows[f"{algorithm}: {label_a} − {label_b}"] = [paired_cell(a, b) for a, b in zip(cells_a, cells_b)]
        if not rows or not columns:
            continue
        dataset, method, _ = table.key.split("/")
        title = table.title.replace(": test accuracy,", f": test accuracy, {label_a} against {label_b} "
                                    "(differences paired by trial_seed),", 1)
        out.append(Table(title, f"{dataset}/{method}/versus", columns, rows, data_source=table.data_source,
                         hparams_choice=table.hparams_choice, protocol=table.protocol))
    if not out:
        raise DomaingenError(f"{label_a} and {label_b} have no algorithm and held-out environment in common")
    return out


# arguments that name where a run lives, not what it computes
NOT_COMPARED_ARGS = ("output_dir",)
RUN_KEY = ("dataset", "algorithm", "test_envs", "hparams_seed", "trial_seed")


def _run_key(args: dict) -> tuple:
    return tuple(tuple(sorted(args.get(k) or ())) if k == "test_envs" else args.get(k) for k in RUN_KEY)


def argument_differences(args_a: Sequence[dict], args_b: Sequence[dict], label_a: str, label_b: str) -> str:
    """One sentence on how two sweeps' twin runs (same dataset, algorithm, test
    environments, hparams_seed and trial_seed) differ in their recorded arguments."""
    twins_b = {_run_key(a): a for a in args_b}
    pairs = [(a, twins_b[_run_key(a)]) for a in args_a if _run_key(a) in twins_b]
    if not pairs:
        return (f"no run of {label_a} has a twin in {label_b} (same {', '.join(RUN_KEY)}): "
                "the differences below pair trials of different runs")
    differing: dict[str, set[tuple[str, str]]] = {}
    for a, b in pairs:
        for key in sorted(set(a) | set(b)):
            if key in NOT_COMPARED_ARGS or a.get(key) == b.get(key):
                continue
            differing.setdefault(key, set()).add((json.dumps(a.get(key)), json.dumps(b.get(key))))
    head = f"{len(pairs)} {'run' if len(pairs) == 1 else 'runs'} of {label_a} {'has' if len(pairs) == 1 else 'have'} a twin in {label_b} (same {', '.join(RUN_KEY)})"
    if not differing:
        return f"{head}; their arguments are identical, so the differences measure run-to-run nondeterminism"
    parts = []
    for key, values in differing.items():
        shown = sorted(values)[:3]
        text = "; ".join(f"{va} in {label_a}, {vb} in {label_b}" for va, vb in shown)
        parts.append(f"{key} ({text}{'; ...' if len(values) > 3 else ''})")
    return f"{head}; their arguments differ in {', '.join(parts)}"
