"""`domaingen check-results`: every generated file under results/ is reprinted from committed records.

`results/regenerate.tsv` has one line per generated file, `PATH<TAB>COMMAND`: run from the
repository root (bash, with `domaingen` meaning the running installation), COMMAND prints
exactly the file's content. A machine measurement that cannot be regenerated has
`PATH<TAB>measured: WHAT AND WHERE` instead. Blank lines and lines starting with `#` are
comments.

The check, file by file:
- every `.md`, `.csv` and `.tex` under results/ other than README.md has a line, and every
  line names a file that exists;
- every records bundle a command names (`results/records/NAME.zip`, written by
  `domaingen export --no_weights --backs PATH ...`) exists, is intact (its checksums) and
  says it backs that file;
- the command's output equals the file; otherwise the first differing line is named.
It reads records and never trains.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from domaingen.errors import DomaingenError

RESULTS = "results"
TSV = f"{RESULTS}/regenerate.tsv"
MEASURED = "measured:"
GENERATED_SUFFIXES = (".md", ".csv", ".tex")
EXEMPT = (f"{RESULTS}/README.md",)


@dataclass(frozen=True)
class Entry:
    """One line of regenerate.tsv: the file, and the command that prints it (or what measured it)."""

    path: str
    command: str
    line: int

    @property
    def measured(self) -> bool:
        return self.command.startswith(MEASURED)


def read_entries(root: Path) -> list[Entry]:
    """The lines of `root`'s results/regenerate.tsv; a line without PATH<TAB>COMMAND or a file named twice
    is refused."""
    tsv = root / TSV
    if not tsv.is_file():
        raise DomaingenError(f"{TSV}: no such file under {root}; it lists PATH<TAB>COMMAND for every generated file in results/")
    entries: list[Entry] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(tsv.read_text().splitlines(), start=1):
        if not text.strip() or text.startswith("#"):
            continue
        path, tab, command = text.partition("\t")
        if not tab or not path.strip() or not command.strip():
            raise DomaingenError(f"{TSV} line {number}: expected PATH<TAB>COMMAND, got {text[:60]!r}")
        if path in seen:
            raise DomaingenError(f"{TSV} line {number}: {path} is already listed on line {seen[path]}")
        seen[path] = number
        entries.append(Entry(path.strip(), command.strip(), number))
    return entries


def generated_files(root: Path) -> list[str]:
    """Every file under results/ that needs a line: .md, .csv and .tex, README.md excepted."""
    found = (p for p in (root / RESULTS).rglob("*") if p.is_file() and p.suffix in GENERATED_SUFFIXES)
    paths = (p.relative_to(root).as_posix() for p in found)
    return sorted(p for p in paths if p not in EXEMPT)


def bundles_named(command: str) -> list[str]:
    """The records bundles (.zip arguments, or the PATH of LABEL=PATH) a command reads."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        words = command.split()
    # a labelled source, LABEL=PATH (collect --input_dir), names PATH
    return [w.split("=", 1)[1] if "=" in w else w for w in words if w.endswith(".zip")]


def check_bundle(root: Path, bundle: str, path: str) -> str | None:
    """None when `bundle` exists, is intact and backs `path`; else one line saying what is wrong."""
    from domaingen.tables.export import open_bundle

    file = root / bundle
    if not file.is_file():
        return f"{path}: its records bundle {bundle} is missing"
    try:
        with open_bundle(file) as opened:
            backs = opened.info.get("backs") or []
    except DomaingenError as exc:
        return f"{path}: {str(exc).replace(str(file), bundle)}"
    if path not in backs:
        named = ", ".join(backs) if backs else "no file"
        return f"{path}: {bundle} backs {named}, not {path} (export it with --backs {path})"
    return None


def first_difference(expected: str, got: str) -> str:
    """'line N: expected ... got ...' for the first line where two texts differ."""
    want, have = expected.splitlines(), got.splitlines()
    for number, (a, b) in enumerate(zip(want, have), start=1):
        if a != b:
            return f"line {number} differs: the file has {a[:80]!r}, the command printed {b[:80]!r}"
    if len(want) != len(have):
        number = min(len(want), len(have)) + 1
        if len(want) > len(have):
            return f"line {number}: the command printed nothing more, the file has {want[number - 1][:80]!r}"
        return f"line {number}: the file ends, the command printed {have[number - 1][:80]!r}"
    return "the line endings differ"


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    # `domaingen` in a command means the installation that runs this check
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def check_entry(root: Path, entry: Entry, write: bool = False) -> str | None:
    """None when the file regenerates; else one line naming the file and what is wrong. With `write`,
    a file that differs is rewritten with what its command printed (and None returned)."""
    file = root / entry.path
    if not file.is_file():
        return f"{TSV} line {entry.line}: {entry.path} does not exist"
    if entry.measured:
        return None
    for bundle in bundles_named(entry.command):
        problem = check_bundle(root, bundle, entry.path)
        if problem:
            return problem
    done = subprocess.run(["bash", "-c", entry.command], cwd=root, env=_environment(),
                          capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        return f"{entry.path}: the command failed (exit {done.returncode}): {last}"
    expected = file.read_text()
    if done.stdout != expected:
        if write:
            file.write_text(done.stdout)
            return None
        return f"{entry.path}: {first_difference(expected, done.stdout)}"
    return None


def check_results(root: Path, only: Sequence[str] = (), jobs: int = 1,
                  report: Callable[[str], None] = print, write: bool = False) -> list[str]:
    """Check every line of results/regenerate.tsv (or those of `only`); returns the problems, one line each.
    With `write`, files that differ from their command's output are rewritten instead."""
    entries = read_entries(root)
    listed = {e.path for e in entries}
    problems = [f"{path}: no line in {TSV}" for path in generated_files(root) if path not in listed]
    if only:
        unknown = [p for p in only if p not in listed]
        if unknown:
            raise DomaingenError(f"--only {unknown[0]}: not listed in {TSV}")
        entries = [e for e in entries if e.path in only]
        problems = [p for p in problems if p.split(":", 1)[0] in only]

    def one(entry: Entry) -> tuple[Entry, str | None]:
        return entry, check_entry(root, entry, write)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for entry, problem in pool.map(one, entries):
            if problem:
                problems.append(problem)
                report(f"FAIL {problem}")
            else:
                report(f"ok   {entry.path}" + ("  (measured, not regenerated)" if entry.measured else ""))
    return problems


def summary(problems: Iterable[str], checked: int) -> str:
    """The closing line of check-results."""
    problems = list(problems)
    if not problems:
        return f"check-results: all {checked} files of {TSV} regenerate from their records"
    return f"check-results: {len(problems)} problem(s):\n" + "\n".join(problems)
