"""Published numbers to print beside ours (`collect --reference FILE.csv`): read and checked here.

The CSV's columns: `dataset`, `algorithm`, `test_env` (an environment's name, else its
index, or `Avg`), `mean` and `error` (percent, as published; `error` may be empty),
`source` (the label the row carries). Optional: `selection` (a selection method's name:
training, loo, oracle, last or a plugin's; empty = a row of every selection's tables) and `table` (test, the default, or
indomain).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from domaingen.datasets import DATASETS
from domaingen.errors import DomaingenError
from domaingen.tables.selection import selection_method_names

REQUIRED = ("dataset", "algorithm", "test_env", "mean", "error", "source")
KINDS = ("test", "indomain")
AVG = "Avg"


def _number(text: str, what: str, where: str, required: bool) -> float:
    if not text and not required:
        return math.nan
    try:
        value = float(text)
    except ValueError:
        raise DomaingenError(f"{where}: {what} {text!r} is not a number (percent, e.g. 71.7)") from None
    if not math.isfinite(value):
        raise DomaingenError(f"{where}: {what} {text!r} is not a finite number")
    return value


def _environment(dataset: str, text: str, where: str) -> str:
    """The column a test_env names: the environment's name, or Avg."""
    if text.lower() == AVG.lower():
        return AVG
    if dataset not in DATASETS:
        return text
    names = list(DATASETS.get(dataset).ENVIRONMENTS)
    if text in names:
        return text
    if text.isdigit() and int(text) < len(names):
        return names[int(text)]
    raise DomaingenError(f"{where}: test_env {text!r} is not an environment of {dataset} ({', '.join(names)}) or Avg")


PUBLISHED_DIR = Path(__file__).with_name("published")
# shipped published numbers that are no accuracy rows: the view that puts them beside ours, by file name
VIEW_FILES = {"csordas": "collect domain-masks", "modreg_claims": "collect verdict", "sandmask_claims": "collect verdict"}


def published_names() -> list[str]:
    """The published-number files shipped with domaingen, by the name `--reference` takes."""
    return sorted(p.stem for p in PUBLISHED_DIR.glob("*.csv") if p.stem not in VIEW_FILES)


def reference_path(name: str | os.PathLike) -> Path:
    """A reference file's path: `name` itself when it is a file, else the shipped file of that name
    (`domainbed_mnist` -> domaingen/tables/published/domainbed_mnist.csv)."""
    path = Path(name)
    if path.is_file() or path.suffix or len(path.parts) > 1:
        return path
    if str(name) in VIEW_FILES:
        raise DomaingenError(f"reference {name} holds no accuracies: `domaingen {VIEW_FILES[str(name)]}` puts its "
                             f"numbers beside ours (--reference takes {', '.join(published_names())})")
    shipped = PUBLISHED_DIR / f"{name}.csv"
    if shipped.is_file():
        return shipped
    raise DomaingenError(f"reference {name}: no such file and no shipped one of that name "
                         f"(shipped: {', '.join(published_names())})")


def read_reference(path: str | os.PathLike) -> pd.DataFrame:
    """The reference file (a path, or the name of a shipped one) as a frame: test_env a column label,
    mean and error fractions (NaN = no error)."""
    path = reference_path(path)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise DomaingenError(f"reference file {path} not found") from None
    except pd.errors.EmptyDataError:
        raise DomaingenError(f"reference file {path} is empty; it needs the columns {', '.join(REQUIRED)}") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split())
        raise DomaingenError(f"reference file {path} is not a readable CSV: {reason}") from None
    frame.columns = [c.strip() for c in frame.columns]
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise DomaingenError(
            f"reference file {path} lacks the column(s) {', '.join(missing)}; it needs {', '.join(REQUIRED)} "
            "(optional: selection, table)"
        )
    frame = frame.apply(lambda column: column.str.strip())
    for optional in ("selection", "table"):
        if optional not in frame.columns:
            frame[optional] = ""
    rows = []
    selections = selection_method_names()
    for i, row in enumerate(frame.to_dict("records")):
        where = f"reference file {path} line {i + 2}"
        if not row["source"]:
            raise DomaingenError(f"{where}: the source is empty; name where the number is published")
        if row["selection"] not in selections + [""]:
            raise DomaingenError(f"{where}: selection {row['selection']!r} is not one of {', '.join(selections)} (or empty)")
        if row["table"] not in KINDS + ("",):
            raise DomaingenError(f"{where}: table {row['table']!r} is not one of {', '.join(KINDS)} (or empty)")
        rows.append({
            **row,
            "test_env": _environment(row["dataset"], row["test_env"], where),
            "mean": _number(row["mean"], "mean", where, required=True) / 100,
            "error": _number(row["error"], "error", where, required=False) / 100,
            "mean_text": row["mean"],
            "error_text": row["error"],
            "table": row["table"] or "test",
        })
    return pd.DataFrame(rows, columns=list(frame.columns) + ["mean_text", "error_text"])


def reference_rows(
    reference: pd.DataFrame, dataset: str, method: str, kind: str
) -> dict[tuple[str, str], dict[str, tuple[float, float, str, str]]]:
    """Per (algorithm, source), in file order: column label -> (mean, error, their printed digits)."""
    if reference.empty:
        return {}
    mine = reference[
        (reference["dataset"] == dataset)
        & reference["selection"].isin([method, ""])
        & (reference["table"] == kind)
    ]
    rows: dict[tuple[str, str], dict[str, tuple[float, float, str, str]]] = {}
    for row in mine.to_dict("records"):
        cell = (row["mean"], row["error"], row["mean_text"], row["error_text"])
        rows.setdefault((row["algorithm"], row["source"]), {})[row["test_env"]] = cell
    return rows
