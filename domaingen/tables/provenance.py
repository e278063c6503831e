"""What the runs behind a table were computed with, from their `manifest.json` (run.manifest).

`collect` groups nothing by it: a table's cells are what they are. But `collect manifest`
lists, for the runs the tables read (every done run collected, after `--datasets`), each
distinct code version, torch version and device with its number of runs, and a table whose
runs (the done runs of its dataset, which its selection compares) come from more than one
code version says so in a note under it. Runs without a manifest count as
"unknown (no manifest.json)".
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

import pandas as pd
from tabulate import tabulate

from domaingen.errors import DomaingenError
from domaingen.run.manifest import code_version, device_text, torch_version
from domaingen.tables.collect import Collection

KINDS = {"code version": code_version, "torch": torch_version, "device": device_text}


def runs_of(collection: Collection, dataset: str | None = None) -> list[str]:
    """The done runs of `dataset` (of every dataset when None or 'all')."""
    records = collection.records
    if dataset not in (None, "all"):
        records = records[records["dataset"] == dataset]
    return sorted(set(records["run"].astype(str)))


def counts(collection: Collection, kind: str, dataset: str | None = None) -> Counter:
    """Runs per distinct value of `kind` (a key of KINDS) among the done runs of `dataset`."""
    describe = KINDS[kind]
    return Counter(describe(collection.manifests.get(run)) for run in runs_of(collection, dataset))


def _listing(counter: Mapping[str, int]) -> str:
    return ", ".join(f"{value} ({n} run{'' if n == 1 else 's'})" for value, n in sorted(counter.items()))


def mixed_versions_note(collection: Collection, dataset: str | None) -> str:
    """One line when the runs behind a table of `dataset` ('all': the averages) mix code versions, else ''."""
    versions = counts(collection, "code version", dataset)
    if len(versions) < 2:
        return ""
    return f"Its runs mix code versions: {_listing(versions)}; `collect manifest` lists them."


def manifest_summary(collection: Collection, fmt: str = "markdown") -> str:
    """`collect manifest`: per kind (code version, torch, device) each distinct value and its run count."""
    if fmt not in ("markdown", "csv"):
        raise DomaingenError(f"collect manifest prints markdown or csv, not {fmt}")
    rows = [{"kind": kind, "value": value, "runs": n}
            for kind in KINDS for value, n in sorted(counts(collection, kind).items())]
    if fmt == "csv":
        return pd.DataFrame(rows, columns=["kind", "value", "runs"]).to_csv(index=False)
    n_runs = len(runs_of(collection))
    parts = [f"### What the {n_runs} done run{'' if n_runs == 1 else 's'} behind these tables were computed with\n"]
    for kind in KINDS:
        body = [[r["value"], r["runs"]] for r in rows if r["kind"] == kind]
        parts.append(tabulate(body, headers=[kind, "runs"], tablefmt="github", disable_numparse=True) + "\n")
    return "\n".join(parts)
