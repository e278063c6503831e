"""`domaingen collect mask-transfer`: the records of `domaingen mask-transfer` (one JSON file per seed) as tables.

Two tables, each cell the mean over the files ± the sample standard deviation (ddof 1; a single
file shows its value alone): per task p >= 1, the share of its kept weights that earlier tasks
already use, per layer and over all layers; per task, its kept and the used weights, its
accuracy right after it was trained and after the last task (their difference is forgetting).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Sequence

from tabulate import tabulate

from domaingen.errors import DomaingenError

EXPERIMENT = "mask_transfer"


def read_records(paths: Sequence[str]) -> list[dict[str, Any]]:
    """The records of `paths`; refuses, in one line, a file that is no such record, or files whose
    settings differ in anything but the seed."""
    records = []
    for path in paths:
        try:
            record = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not JSON"
            raise DomaingenError(f"--records {path}: {reason}; give the JSON files `domaingen mask-transfer` wrote") from None
        if not isinstance(record, dict) or record.get("experiment") != EXPERIMENT:
            raise DomaingenError(f"--records {path} is not a record of `domaingen mask-transfer`")
        records.append(record)
    first = {k: v for k, v in records[0]["settings"].items() if k != "seed"}
    for path, record in zip(paths, records):
        other = {k: v for k, v in record["settings"].items() if k != "seed"}
        if other != first:
            differ = sorted(k for k in first.keys() | other.keys() if first.get(k) != other.get(k))
            raise DomaingenError(f"--records {path} differs from {paths[0]} in {', '.join(differ)}; tabulate the "
                                 "records of one setting (seeds may differ)")
    return records


def _cell(values: Sequence[float | None], scale: float = 100.0, digits: int = 1) -> str:
    """mean ± sample std of the finite values (in %), '-' when there are none."""
    finite = [v * scale for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return "-"
    mean = sum(finite) / len(finite)
    if len(finite) == 1:
        return f"{mean:.{digits}f}"
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def transfer_tables(records: Sequence[dict[str, Any]]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(caption, headers, rows) of the sharing table and the accuracy table."""
    settings = records[0]["settings"]
    layers = [name.split(" ")[0] for name in records[0]["layers"]]
    n_tasks = settings["tasks"]
    seeds = ", ".join(str(r["settings"]["seed"]) for r in records)
    what = (f"{n_tasks} permutations of MNIST learnt in turn, {settings['steps']} steps each, widths "
            f"{','.join(map(str, settings['widths']))}, lr {settings['lr']:g}, alpha {settings['alpha']:g}, "
            f"mask init {settings['mask_used_init']:g} (used) / {settings['mask_new_init']:g} (new), "
            f"{settings['mask_samples']} mask samples per step, biases {'masked' if settings['mask_biases'] else 'unmasked'}; "
            f"seeds {seeds} (mean ± sample std over seeds)")
    sharing_rows = []
    for p in range(1, n_tasks):
        tasks = [r["tasks"][p] for r in records]
        sharing_rows.append([f"p{p}", *(_cell([t["shared"][l] for t in tasks]) for l in range(len(layers))),
                             _cell([t["shared_total"] for t in tasks])])
    sharing = (f"Share of each task's kept weights that earlier tasks already use, |M_p & (M_0 | ... | M_p-1)| / "
               f"|M_p|, in %, per layer (in x out) and over all layers: {what}.",
               ["task", *records[0]["layers"], "all layers"], sharing_rows)
    accuracy_rows = []
    for p in range(n_tasks):
        tasks = [r["tasks"][p] for r in records]
        when = [r["accuracy_when_trained"][p] for r in records]
        after = [r["accuracy_after_last_task"][p] for r in records]
        accuracy_rows.append([f"p{p}", _cell([t["kept_total"] for t in tasks], digits=2),
                              _cell([t["used_total"] for t in tasks], digits=2),
                              _cell(when, digits=2), _cell(after, digits=2),
                              _cell([w - a for w, a in zip(when, after)], digits=2)])
    accuracy = (f"Each task's kept weights and the weights tasks 0..p use (% of all weights), and its test accuracy "
                f"with its own mask (%) right after it was trained and after the last task: {what}.",
                ["task", "kept", "used by 0..p", "accuracy when trained", "after the last task", "forgetting"],
                accuracy_rows)
    return [sharing, accuracy]


def render(records: Sequence[dict[str, Any]], fmt: str = "markdown") -> str:
    """The tables as markdown (caption, then a pipe table) or CSV (a `table` column first)."""
    tables = transfer_tables(records)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for i, (_, headers, rows) in enumerate(tables):
            writer.writerow(["table", *headers])
            writer.writerows([[["sharing", "accuracy"][i], *row] for row in rows])
        return out.getvalue()
    parts = [f"{caption}\n\n{tabulate(rows, headers=headers, tablefmt='pipe', disable_numparse=True)}"
             for caption, headers, rows in tables]
    return "\n\n".join(parts) + "\n"
