"""Read every run directory of a sweep into one pandas DataFrame.

Only runs with a `done` marker count. Output directories written by DomainBed
itself (same results.jsonl field names and `done` marker) are read the same way.
Each record's `data_source` (where its examples came from) becomes a column;
a record without it reads as "unknown". So does its `protocol`
(domaingen.run.protocol): a domaingen run recorded without one reads as `paired`, a run
DomainBed wrote as `domainbed`. One collection holds one protocol: `collect` refuses
a directory that mixes them unless told which to read.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from domaingen.datasets import DATASETS
from domaingen.errors import DomaingenError
from domaingen.networks import describe_backbone
from domaingen.run.manifest import read_manifest
from domaingen.run.protocol import DOMAINBED, RECORDED_DEFAULT, check_protocol
from domaingen.run.rundir import DONE, FAILED, RESULTS, read_jsonl

log = logging.getLogger(__name__)

UNKNOWN_SOURCE = "unknown"
COMBINED_DIR = "combined"  # a sweep's combined runs (DiWA, soups, ENS: inspect.combine), read as runs
# Test-time modes an algorithm reports beside its default (Algorithm.EVAL_MODES, fields
# env{i}_{in,out}_acc_{mode}) become table rows named '{algorithm}-{label}'.
MODE_LABELS = {"kd": "KD", "mask_ens": "MaskEns", "zero_shot": "ZeroShot"}
MODE_FIELD = re.compile(r"^env(\d+)_(in|out|idtest)_acc_(\w+)$")
IN_ACC_FIELD = re.compile(r"^env(\d+)_in_acc$")
OUT_ACC_FIELD = re.compile(r"^env(\d+)_out_acc$")
# Derived record fields: a run's mean in-split accuracy over its training environments, and
# whether that is within COLLAPSE_MARGIN of chance (1 / the dataset's classes): a run that
# does not fit its own training data has collapsed, whatever its held-out score reads.
TRAIN_ACC = "train_acc"
COLLAPSED = "train_collapsed"
COLLAPSE_MARGIN = 0.05


@dataclass
class Collection:
    """The records of done runs, plus what was left out and why."""

    records: pd.DataFrame
    failed: list[tuple[str, str]] = field(default_factory=list)  # (run dir, reason)
    incomplete: list[str] = field(default_factory=list)
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per run dir, with its state
    manifests: dict[str, dict | None] = field(default_factory=dict)  # done run -> its manifest.json (None: none)
    bundle: dict | None = None  # the bundle.json when read from a bundle (tables.export)
    protocol: str = RECORDED_DEFAULT  # the protocol every record followed
    # records of done runs left out, so tables can say so: (the file, how many, which and why)
    skipped: list[tuple[str, int, str]] = field(default_factory=list)
    # test-time adaptation results read as records of algorithms 'X+ADAPTER' (adapted_records)
    adapted: pd.DataFrame = field(default_factory=pd.DataFrame)


# Arguments only DomainBed's train.py records: a run without `protocol` that has one is DomainBed's own.
DOMAINBED_ONLY_ARGS = ("uda_holdout_fraction", "skip_model_save", "task")


def run_protocol(args: dict) -> str:
    """The protocol a run followed, from its recorded arguments."""
    if "protocol" in args:
        return str(args["protocol"])
    return DOMAINBED if any(key in args for key in DOMAINBED_ONLY_ARGS) else RECORDED_DEFAULT


def _run_dirs(input_dir: Path) -> list[Path]:
    """The run directories of a sweep, its combined runs (`domaingen average`) included, or the run itself."""
    if (input_dir / RESULTS).exists():
        return [input_dir]
    found = []
    for folder in (input_dir, input_dir / COMBINED_DIR):
        if folder.is_dir():
            with os.scandir(folder) as entries:
                found += sorted(Path(e.path) for e in entries if e.is_dir())
    return found


def _run_name(path: Path, root: Path) -> str:
    """A run's name in tables: its directory's path under the sweep (`combined/...` for a combined run)."""
    return path.name if path == root else path.relative_to(root).as_posix()


def _flatten(record: dict, run: str) -> dict | None:
    args = record.get("args")
    if not isinstance(args, dict) or "step" not in record:
        return None
    row = {k: v for k, v in record.items() if k not in ("args", "hparams") and not isinstance(v, (dict, list))}
    row["run"] = run
    row["dataset"] = args.get("dataset")
    row["algorithm"] = args.get("algorithm")
    row["test_envs"] = tuple(sorted(args.get("test_envs", ())))
    row["hparams_seed"] = args.get("hparams_seed", 0)
    row["trial_seed"] = args.get("trial_seed", 0)
    row["hparams"] = json.dumps(record.get("hparams", {}), sort_keys=True)
    row["data_source"] = record.get("data_source") or args.get("data_source") or UNKNOWN_SOURCE
    hparams = record.get("hparams")
    row["backbone"] = describe_backbone(hparams) if isinstance(hparams, dict) and _has_backbone(row["dataset"]) else None
    row["protocol"] = run_protocol(args)
    row["in_domain_test"] = args.get("in_domain_test")  # the in-domain table's caption names its split
    row.update(training_accuracy(row, row["test_envs"], row["dataset"]))
    return row


def training_accuracy(record: Mapping, test_envs: Sequence[int], dataset: object,
                      split_field: re.Pattern = IN_ACC_FIELD) -> dict[str, float]:
    """{TRAIN_ACC: mean env{i}_in_acc over the environments not in `test_envs`, COLLAPSED: 1.0 when
    that is at most chance + COLLAPSE_MARGIN, else 0.0}; COLLAPSED only when the dataset's class
    count is known, nothing when the record has no training environment's in-split accuracy.
    `split_field` = OUT_ACC_FIELD reads the training environments' out (validation) splits instead."""
    held_out = set(test_envs)
    values = [float(v) for k, v in record.items()
              if (m := split_field.match(k)) and int(m.group(1)) not in held_out and isinstance(v, (int, float))
              and not math.isnan(v)]
    if not values:
        return {}
    mean = sum(values) / len(values)
    out = {TRAIN_ACC: mean}
    try:
        classes = int(DATASETS.get(str(dataset)).NUM_CLASSES)
    except DomaingenError:
        classes = 0
    if classes > 1:
        out[COLLAPSED] = float(mean <= 1.0 / classes + COLLAPSE_MARGIN)
    return out


def _has_backbone(dataset: object) -> bool:
    """Whether runs of `dataset` use an image backbone: not MNIST-sized inputs (28 x 28), which
    DomainBed's networks and ours give MNIST_CNN or the MLP whatever the backbone flags say (its
    records of ColoredMNIST carry `resnet50_augmix: true`). An unknown dataset is assumed to."""
    try:
        shape = tuple(DATASETS.get(str(dataset)).INPUT_SHAPE)
    except DomaingenError:
        return True
    return shape[1:3] != (28, 28)


def _first_record_args(path: Path) -> dict:
    """The args of a run's first record: DomainBed's run directories have no args.json."""
    try:
        with open(path / RESULTS) as f:
            first = json.loads(f.readline())
    except (OSError, json.JSONDecodeError):
        return {}
    return first.get("args") or {} if isinstance(first, dict) else {}


def _run_row(path: Path, name: str, state: str, first: dict | None) -> dict:
    args = (first or {}).get("args") or {}
    if not args and (path / "args.json").exists():
        try:
            args = json.loads((path / "args.json").read_text())
        except json.JSONDecodeError:
            args = {}
    if not args and (path / RESULTS).exists():
        args = _first_record_args(path)
    return {
        "run": name,
        "state": state,
        "dataset": args.get("dataset"),
        "algorithm": args.get("algorithm"),
        "test_envs": tuple(sorted(args.get("test_envs", ()))),
        "hparams_seed": args.get("hparams_seed"),
        "trial_seed": args.get("trial_seed"),
        "protocol": run_protocol(args) if args else None,
    }


def collect(input_dir: str | os.PathLike, allow_mixed_sources: bool = False, protocol: str | None = None) -> Collection:
    """Every record of every done run under `input_dir` (one level deep, or the dir itself).

    Raises DomaingenError when one dataset's runs come from different data sources
    (check_data_sources), unless `allow_mixed_sources`, and when the runs followed
    different protocols, unless `protocol` names the one to keep.
    """
    root = Path(input_dir)
    if not root.is_dir():
        raise DomaingenError(f"input_dir {root} is not a directory")
    rows: list[dict] = []
    run_rows: list[dict] = []
    failed: list[tuple[str, str]] = []
    incomplete: list[str] = []
    manifests: dict[str, dict | None] = {}
    skipped: list[tuple[str, int, str]] = []
    adapted: list[dict] = []
    for path in _run_dirs(root):
        name = _run_name(path, root)
        if (path / DONE).exists():
            manifests[name] = read_manifest(path)
            unreadable: list[int] = []
            records = read_jsonl(path / RESULTS, unreadable)
            flat = [r for r in (_flatten(rec, name) for rec in records) if r is not None]
            if unreadable:
                lines = ", ".join(map(str, unreadable))
                skipped.append((f"{name}/{RESULTS}", len(unreadable),
                                f"unreadable line{'s' * (len(unreadable) > 1)} {lines}"))
            if len(flat) < len(records):
                log.warning("skipping %d records without args or step in %s", len(records) - len(flat), path)
                skipped.append((f"{name}/{RESULTS}", len(records) - len(flat), "records without args or step"))
            rows.extend(flat)
            adapted.extend(adapted_records(path, flat[0]) if flat else [])
            run_rows.append(_run_row(path, name, "done", records[0] if records else None))
        elif (path / FAILED).exists():
            failed.append((name, (path / FAILED).read_text().strip()))
            run_rows.append(_run_row(path, name, "failed", None))
        elif (path / RESULTS).exists() or (path / "args.json").exists():
            incomplete.append(name)
            run_rows.append(_run_row(path, name, "incomplete", None))
    if not rows:
        raise DomaingenError(
            f"no finished runs in {root} (found {len(failed)} failed, {len(incomplete)} incomplete); "
            "launch or resume the sweep first (domaingen sweep launch)"
        )
    collection = only_protocol(Collection(pd.DataFrame(rows), failed, incomplete, pd.DataFrame(run_rows), manifests,
                                          skipped=skipped, adapted=pd.DataFrame(adapted)), protocol, str(root))
    if not allow_mixed_sources:
        check_data_sources(collection.records)
    return collection


def only_protocol(collection: Collection, protocol: str | None, where: str) -> Collection:
    """The runs of one protocol: `protocol`, else the only one present (two or more is an error)."""
    present = collection.records.groupby("protocol")["run"].nunique()
    if protocol is None:
        if len(present) > 1:
            listing = " and ".join(f"{name} ({n} runs)" for name, n in present.items())
            choices = " or ".join(f"--protocol {name}" for name in present.index)
            raise DomaingenError(f"{where} holds runs of two protocols, {listing}; a table holds one: "
                                 f"collect with {choices}")
        collection.protocol = str(present.index[0])
        return collection
    check_protocol(protocol)
    if protocol not in present:
        raise DomaingenError(f"--protocol {protocol}: no finished run of that protocol in {where} "
                             f"(its protocols: {', '.join(present.index)})")
    records = collection.records[collection.records["protocol"] == protocol].reset_index(drop=True)
    runs = collection.runs
    if len(runs):
        runs = runs[(runs["protocol"] == protocol) | runs["protocol"].isna()].reset_index(drop=True)
    kept = set(runs["run"]) if len(runs) else set()
    return Collection(records, [(r, why) for r, why in collection.failed if r in kept],
                      [r for r in collection.incomplete if r in kept], runs,
                      {run: m for run, m in collection.manifests.items() if run in kept}, collection.bundle, protocol,
                      [item for item in collection.skipped if item[0].rsplit("/", 1)[0] in kept],
                      _adapted_of(collection.adapted, set(records["run"])))


def only_datasets(collection: Collection, datasets: Sequence[str], where: str) -> Collection:
    """The part of `collection` that belongs to `datasets` (records, runs, failed and incomplete ones);
    a name with no run under `where` is an error that lists the datasets there."""
    return _only(collection, "dataset", datasets, where)


def only_algorithms(collection: Collection, algorithms: Sequence[str], where: str) -> Collection:
    """The part of `collection` whose runs train one of `algorithms` (by their exact name, any case: 'IRM'
    keeps IRM, not IRM+ModReg); a name with no run under `where` is an error that lists the algorithms there."""
    return _only(collection, "algorithm", algorithms, where)


def _only(collection: Collection, column: str, names: Sequence[str], where: str) -> Collection:
    """The runs of `collection` whose `column` (dataset or algorithm) is one of `names`, any case."""
    present = sorted({str(d) for d in collection.runs.get(column, pd.Series(dtype=object)).dropna()}
                     | set(collection.records[column].dropna().astype(str)))
    by_case = {name.casefold(): name for name in present}
    names = [name if name in present else by_case.get(name.casefold(), name) for name in names]
    unknown = [name for name in names if name not in present]
    if unknown:
        raise DomaingenError(f"--{column}s {' '.join(unknown)}: no run of {', '.join(unknown)} in {where} "
                             f"(its {column}s: {', '.join(present)})")
    wanted = set(names)
    runs = collection.runs[collection.runs[column].isin(wanted)] if len(collection.runs) else collection.runs
    kept = set(runs["run"]) if len(runs) else set()
    # fields only the other runs record (their environments, their layers) go too
    records = collection.records[collection.records[column].isin(wanted)].dropna(axis=1, how="all")
    records = records.reset_index(drop=True)
    if records.empty:
        raise DomaingenError(f"no finished runs of {', '.join(names)} in {where} "
                             f"({len(kept)} runs of them, none done); launch or resume the sweep first")
    return Collection(records, [(run, why) for run, why in collection.failed if run in kept],
                      [run for run in collection.incomplete if run in kept], runs.reset_index(drop=True),
                      {run: m for run, m in collection.manifests.items() if run in kept}, collection.bundle, collection.protocol,
                      [item for item in collection.skipped if item[0].rsplit("/", 1)[0] in kept],
                      _adapted_of(collection.adapted, set(records["run"])))


ADAPTED_FILES = "adapted_*.jsonl"  # domaingen.adapt.run writes one per adapter beside a run
# the record fields of a run that its adapted records keep (what selection and the captions read)
ADAPTED_KEPT = ("dataset", "test_envs", "trial_seed", "data_source", "backbone", "protocol", "in_domain_test")


def adapted_records(path: Path, run_row: dict) -> list[dict]:
    """The stored test-time adaptation results of the run at `path` as records (`run_row`: one of its
    flattened records).

    Each (adapter, grid point) is a record of algorithm '{algorithm}+{adapter}' whose
    `base_algorithm` is the run's, in a run named '{run}#{adapter}#{grid index}', with the
    adapted accuracies and the selected step. Its hparams_seed is the run's times the
    grid's size plus the point's index: the adapter's grid is one more dimension of the
    draws that selection searches (training-domain validation on the training domains'
    adapted `out` splits, the oracle on the held-out one's), and `hparams` holds the
    point under "adapt".
    """
    rows = []
    for file in sorted(path.glob(ADAPTED_FILES)):
        for record in read_jsonl(file):
            if not isinstance(record, dict) or "adapter" not in record:
                continue
            row = {key: run_row.get(key) for key in ADAPTED_KEPT}
            row.update({k: v for k, v in record.items() if re.fullmatch(r"env\d+_(in|out)_acc", k)})
            size, index = int(record.get("grid_size", 1)), int(record.get("grid_index", 0))
            hparams = {**json.loads(run_row.get("hparams") or "{}"), "adapt": record.get("adapt_hparams", {})}
            row.update(run=f"{path.name}#{record['adapter']}#{index}", step=record.get("step", 0),
                       algorithm=f"{run_row['algorithm']}+{record['adapter']}", base_algorithm=run_row["algorithm"],
                       adapter=record["adapter"], hparams_seed=int(run_row["hparams_seed"]) * size + index,
                       hparams=json.dumps(hparams, sort_keys=True))
            rows.append(row)
    return rows


def _adapted_of(adapted: pd.DataFrame, runs: set[str]) -> pd.DataFrame:
    """The adapted records of `runs` (run directory names)."""
    if adapted.empty:
        return adapted
    return adapted[adapted["run"].map(lambda run: run.split("#", 1)[0] in runs)].reset_index(drop=True)


def table_records(collection: Collection) -> pd.DataFrame:
    """What the tables select from: the records, each test-time mode's copy (expand_modes), and the
    adapted records (adapted_records)."""
    records = expand_modes(collection.records)
    if collection.adapted.empty:
        return records
    return pd.concat([records, collection.adapted], ignore_index=True)


def adapted_algorithms(records: pd.DataFrame) -> list[str]:
    """The adapted rows' algorithms ('ERM+T3A', ...) among `records`, sorted."""
    if "adapter" not in records:
        return []
    return sorted(records.loc[records["adapter"].notna(), "algorithm"].unique())


def labelled(collection: Collection, label: str, algorithms: bool = True) -> Collection:
    """`collection` with every algorithm named `ALGORITHM (label)` and every run `label/RUN`,
    so that several sweeps' runs can stand in one table as rows of their own (with `algorithms`
    False only the runs are renamed: the sweeps' runs of one algorithm then share its rows)."""

    def rename(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.copy()
        for column in ("algorithm", "base_algorithm") if algorithms else ():
            if column in frame:
                frame[column] = frame[column].map(lambda a: f"{a} ({label})" if isinstance(a, str) else a)
        if "run" in frame:
            frame["run"] = frame["run"].map(lambda r: f"{label}/{r}")
        return frame

    return Collection(rename(collection.records), [(f"{label}/{run}", why) for run, why in collection.failed],
                      [f"{label}/{run}" for run in collection.incomplete], rename(collection.runs),
                      {f"{label}/{run}": m for run, m in collection.manifests.items()}, None, collection.protocol,
                      [(f"{label}/{file}", n, why) for file, n, why in collection.skipped],
                      rename(collection.adapted))


def split_by_hparams(collection: Collection, keys: Sequence[str]) -> Collection:
    """`collection` with each algorithm split by the values of hyperparameters `keys`: a run whose
    hparams hold any of them is named `ALGORITHM (key=value, ...)`, so that the points of a grid
    (runs of one algorithm, hparams seed and trial that differ in these values) become rows.
    Runs without any of the keys keep their name. A key no run has is an error."""
    decoded = {h: json.loads(h) for h in collection.records["hparams"].unique()}
    present = {k for h in decoded.values() for k in h}
    unknown = [k for k in keys if k not in present]
    if unknown:
        raise DomaingenError(f"--split_by {unknown[0]}: no run has this hyperparameter (they have: "
                             f"{', '.join(sorted(present))})")

    def name(algorithm: str, hparams: str) -> str:
        values = [f"{k}={json.dumps(decoded[hparams][k])}" for k in keys if k in decoded[hparams]]
        return f"{algorithm} ({', '.join(values)})" if values else algorithm

    records = collection.records.copy()
    records["algorithm"] = [name(a, h) for a, h in zip(records["algorithm"], records["hparams"])]
    adapted = collection.adapted.copy()
    if len(adapted):
        for h in adapted["hparams"].unique():
            decoded.setdefault(h, json.loads(h))
        for column in ("algorithm", "base_algorithm"):
            adapted[column] = [name(a, h) for a, h in zip(adapted[column], adapted["hparams"])]
    by_run = records.drop_duplicates("run").set_index("run")["algorithm"]
    runs = collection.runs.copy()
    if len(runs) and "algorithm" in runs:
        runs["algorithm"] = [by_run.get(r, a) for r, a in zip(runs["run"], runs["algorithm"])]
    return Collection(records, collection.failed, collection.incomplete, runs, collection.manifests,
                      collection.bundle, collection.protocol, collection.skipped, adapted)


def merged(parts: Sequence[tuple[str, Collection]], label_algorithms: bool = True) -> Collection:
    """Several labelled collections as one (see `labelled`); they must share a protocol."""
    protocols = {label: c.protocol for label, c in parts}
    if len(set(protocols.values())) > 1:
        listed = ", ".join(f"{label}: {protocol}" for label, protocol in protocols.items())
        raise DomaingenError(f"the inputs follow different protocols ({listed}); a table never mixes them")
    named = [labelled(c, label, label_algorithms) for label, c in parts]
    return Collection(pd.concat([c.records for c in named], ignore_index=True),
                      [f for c in named for f in c.failed], [r for c in named for r in c.incomplete],
                      pd.concat([c.runs for c in named], ignore_index=True),
                      {run: m for c in named for run, m in c.manifests.items()}, None, parts[0][1].protocol,
                      [item for c in named for item in c.skipped],
                      pd.concat([c.adapted for c in named], ignore_index=True))


def data_sources(records: pd.DataFrame) -> list[str]:
    """The distinct data sources of these records, sorted ("unknown" for records without one)."""
    if "data_source" not in records:
        return [UNKNOWN_SOURCE] if len(records) else []
    return sorted(records["data_source"].fillna(UNKNOWN_SOURCE).astype(str).unique())


def check_data_sources(records: pd.DataFrame) -> None:
    """Raise DomaingenError, in one line, if any dataset's runs come from more than one data source."""
    if "data_source" not in records:
        return
    for dataset, sub in records.groupby("dataset", sort=True):
        per_source = sub.fillna({"data_source": UNKNOWN_SOURCE}).groupby("data_source")["run"].nunique()
        if len(per_source) > 1:
            listing = ", ".join(f"{n} runs from {source}" for source, n in per_source.items())
            raise DomaingenError(
                f"{dataset} mixes data sources ({listing}); collect each source from its own directory, "
                "or pass --allow_mixed_sources to tabulate them together"
            )


def expand_modes(records: pd.DataFrame) -> pd.DataFrame:
    """The records plus, per test-time mode found in them, a copy that reads as its own algorithm.

    A copy is named '{algorithm}-{label}' (e.g. DMG-KD), its env{i}_{in,out}_acc are
    the mode's accuracies, NaN where the mode is undefined (KD on a test
    environment), its `run` is '{run}#{mode}', and its `base_algorithm` column
    names the algorithm that ran.
    """
    modes: dict[str, list[tuple[str, str]]] = {}
    for column in records.columns:
        match = MODE_FIELD.match(column)
        if match:
            modes.setdefault(match.group(3), []).append((f"env{match.group(1)}_{match.group(2)}_acc", column))
    parts = [records]
    for mode, columns in sorted(modes.items()):
        has_mode = records[[c for _, c in columns]].notna().any(axis=1)
        if not has_mode.any():
            continue
        copy = records[has_mode].copy()
        base_columns = [c for c in copy.columns if re.fullmatch(r"env\d+_(in|out|idtest)_acc", c)]
        copy[base_columns] = float("nan")
        for base, column in columns:
            copy[base] = copy[column]
        copy["base_algorithm"] = copy["algorithm"]
        copy["run"] = copy["run"] + "#" + mode  # selection picks one checkpoint per run name
        copy["algorithm"] = copy["algorithm"] + "-" + MODE_LABELS.get(mode, mode)
        parts.append(copy)
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else records


class RunGrid:
    """The sweep's grid of runs per (dataset, algorithm), indexed once for many cells.

    For a cell, the grid is inferred from every run directory of (dataset, algorithm):
    each hparams_seed seen x each trial_seed seen, for the single test env and, for
    leave-one-domain-out (`pairs`), every pair {test_env, v} seen for this dataset. A
    DomainBed sweep where one trial lacks some hparams draws thus counts them as missing.
    """

    def __init__(self, runs: pd.DataFrame):
        self._groups: dict[tuple[str, str], tuple[set, set, set]] = {}
        self._pairs: dict[str, set[tuple[int, ...]]] = {}
        if runs.empty or "state" not in runs:
            return
        for (dataset, algorithm), mine in runs.groupby(["dataset", "algorithm"], sort=False):
            done = mine[mine["state"] == "done"]
            have = {(int(h), int(t), tuple(e)) for h, t, e in zip(done["hparams_seed"], done["trial_seed"], done["test_envs"])}
            self._groups[(dataset, algorithm)] = (set(mine["hparams_seed"].dropna().unique()),
                                                  set(mine["trial_seed"].dropna().unique()), have)
            self._pairs.setdefault(dataset, set()).update(tuple(e) for e in mine["test_envs"] if len(e) == 2)

    def missing(self, dataset: str, algorithm: str, test_env: int, pairs: bool = False) -> int:
        """How many runs the cell needs that are not done: failed, unfinished, or never written."""
        if (dataset, algorithm) not in self._groups:
            return 0
        seeds, trials, have = self._groups[(dataset, algorithm)]
        needed = {(test_env,)}
        if pairs:
            needed |= {e for e in self._pairs.get(dataset, ()) if test_env in e}
        grid = {(int(h), int(t), e) for h in seeds for t in trials for e in needed}
        return len(grid - have)


def n_environments(records: pd.DataFrame, dataset: str) -> int:
    """How many environments a dataset's records report."""
    sub = records[records["dataset"] == dataset]
    n = 0
    while f"env{n}_in_acc" in sub.columns and sub[f"env{n}_in_acc"].notna().any():
        n += 1
    return n
