"""`domaingen sweep restore`: a sweep directory rebuilt from an exported bundle, so that a sweep continues
where its bundle left it.

A bundle (`domaingen export`, with `--all_runs` for every run's records) holds the sweep's spec
(sweep.json) and its done runs' records, with weights where it was exported with them. Restoring writes
each done run's directory back under the sweep directory and the spec beside them; `sweep launch` then
counts those runs done and runs the rest (`--parts` and `--n_trials` choose some of them and keep the
recorded spec), and `domaingen export` bundles the old runs and the new together again.

A run of the bundle that is not done (incomplete or failed) is not restored: without its checkpoint it
could not resume, so `sweep launch` runs it from the start. A run directory already in the sweep
directory is left as it is.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from domaingen.errors import DomaingenError
from domaingen.run.rundir import DONE_STATE, RunDirectory, atomic_write_bytes
from domaingen.tables.export import RUNS, SWEEP_FILE, copy_weights, open_bundle

STAGING = ".restoring"


@dataclass
class Restored:
    """What `restore_bundle` did: run ids restored, found already there, and left out as not done."""

    restored: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    not_done: list[str] = field(default_factory=list)
    with_weights: int = 0
    spec_written: bool = False


def restore_bundle(bundle: str | os.PathLike, sweep_dir: str | os.PathLike) -> Restored:
    """Write a bundle's done runs (records, and weights where it has them) and its sweep.json into
    `sweep_dir`. Refuses, writing nothing, a damaged bundle, one without runs, and a sweep directory whose
    sweep.json records another spec than the bundle's."""
    source, target = Path(bundle), Path(sweep_dir)
    if not source.exists():
        raise DomaingenError(f"{source}: no such bundle; give a FILE.zip that domaingen export wrote, or its "
                             f"unpacked folder")
    with open_bundle(source) as opened:
        runs_dir = opened.root / RUNS
        if not runs_dir.is_dir():
            raise DomaingenError(f"{source} holds no runs to restore (no {RUNS}/ folder)")
        spec = opened.root / SWEEP_FILE
        spec_bytes = spec.read_bytes() if spec.is_file() else None
        _check_same_sweep(target, spec_bytes, source)
        existed = target.exists()
        staging = target / STAGING
        try:
            target.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(staging, ignore_errors=True)
            done = _stage_runs(source, opened.info, runs_dir, target, staging)
            done.spec_written = spec_bytes is not None and not (target / SWEEP_FILE).exists()
            for run in done.restored:
                os.replace(staging / RUNS / run, target / run)
            if done.spec_written:
                atomic_write_bytes(target / SWEEP_FILE, spec_bytes)
        except (OSError, DomaingenError) as exc:
            if not existed:
                shutil.rmtree(target, ignore_errors=True)
            if isinstance(exc, DomaingenError):
                raise
            raise DomaingenError(f"cannot restore into {target}: {exc.strerror or exc}") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return done


def _check_same_sweep(target: Path, spec_bytes: bytes | None, source: Path) -> None:
    there = target / SWEEP_FILE
    if spec_bytes is None or not there.exists():
        return
    try:
        same = json.loads(there.read_text()) == json.loads(spec_bytes)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        same = False
    if not same:
        raise DomaingenError(f"{target} holds another sweep than {source} ({SWEEP_FILE} differs); restore into "
                             f"an empty --output_dir")


def _stage_runs(source: Path, info: dict, runs_dir: Path, target: Path, staging: Path) -> Restored:
    """Copy the done runs not yet in `target` into `staging`/runs, weights checked against bundle.json."""
    done = Restored()
    for run in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        if RunDirectory(run).state() != DONE_STATE:
            done.not_done.append(run.name)
        elif (target / run.name).exists():
            done.present.append(run.name)
        else:
            shutil.copytree(run, staging / RUNS / run.name, ignore=shutil.ignore_patterns("*.pt"))
            weights = sorted(arc for arc in info["files"]
                             if arc.startswith(f"{RUNS}/{run.name}/") and arc.endswith(".pt"))
            copy_weights(source, info, weights, staging)
            done.with_weights += bool(weights)
            done.restored.append(run.name)
    return done
