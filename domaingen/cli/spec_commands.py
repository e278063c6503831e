"""`domaingen spec`: the sweep specs the package ships (the README's `sweeps/*.toml`), listed,
printed or copied.

They are package data at `domaingen/specs/`: in a clone that folder is a symlink to the top-level
`sweeps/`, and a wheel holds copies of its `*.toml` files, so a clone, an editable install and
an installed wheel read the same files.
"""

from __future__ import annotations

import argparse
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from tabulate import tabulate

from domaingen.errors import DomaingenError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `spec` subcommand: no NAME lists the shipped specs, NAME prints one, --output copies it."""
    p = sub.add_parser("spec", help="list the sweep specs the package ships, print one, or copy it to a file")
    p.add_argument("name", nargs="?", metavar="NAME", help="a spec's name (demo, or demo.toml); none: list them")
    p.add_argument("--output", metavar="FILE", help="write the spec to FILE (then launch it with --spec FILE)")


def shipped_specs() -> dict[str, Traversable]:
    """Spec name (the file name without .toml) -> its file, in name order."""
    folder = files("domaingen").joinpath("specs")
    if not folder.is_dir():
        return {}
    found = [item for item in folder.iterdir() if item.name.endswith(".toml") and item.is_file()]
    return {item.name.removesuffix(".toml"): item for item in sorted(found, key=lambda item: item.name)}


def find_spec(name: str) -> Traversable:
    """The shipped spec called `name` (with or without .toml); DomaingenError naming every valid one."""
    specs = shipped_specs()
    key = name.removesuffix(".toml")
    if key not in specs:
        raise DomaingenError(f"no shipped spec {name!r}; choose one of: {', '.join(specs) or '(none shipped)'}")
    return specs[key]


def summary(spec: Traversable) -> str:
    """A spec's first comment line, without its '# '."""
    for line in spec.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
        if line.strip():
            break
    return ""


def run(ns: argparse.Namespace) -> int:
    """List the shipped specs, print one, or write it to --output; returns the exit status."""
    if ns.name is None:
        if ns.output is not None:
            raise DomaingenError("--output needs a spec's NAME: domaingen spec NAME --output FILE")
        rows = [[name, summary(spec)] for name, spec in shipped_specs().items()]
        print(tabulate(rows, headers=["spec", "what it runs"]))
        print("\n`domaingen spec NAME` prints one; `domaingen spec NAME --output FILE` copies it for `sweep launch --spec FILE`")
        return 0
    spec = find_spec(ns.name)
    if ns.output is None:
        print(spec.read_text(encoding="utf-8"), end="")
        return 0
    Path(ns.output).write_bytes(spec.read_bytes())
    print(f"wrote {ns.output}")
    return 0
