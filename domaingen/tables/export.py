"""A shareable bundle of what a table selected: `domaingen export`, and `collect` reading one back.

`domaingen export --input_dir SWEEP --output FILE.zip [--selection training ...] [--no_weights]`
writes one zip, everything under a folder named after the file:

    bundle.json     what the bundle holds: the selection methods, the sweep's grid of runs
                    (every run's state, so cells that lack runs say so as they did), the
                    failed and incomplete runs, and a SHA-256 of every file
    README.md       how to collect and evaluate from it
    tables.md       the tables, as `collect` printed them from the sweep
    records.tar.xz  the records, one LZMA stream (format 2, the default: `--records solid`):
                    sweep.json, the sweep's spec when it has one, and each run's
                    runs/RUN/ args.json, manifest.json, results.jsonl, log.txt, done,
                    diagnostics.json (evaluate's and diagnose's measurements, where the run has them)
    runs/RUN/       the weights: selected.pt (the checkpoint training-domain validation chose) and,
                    for a run whose chosen checkpoint is its last one (oracle, last), checkpoint.pt

Runs repeat their keys and arguments in every record, so compressing the records together
takes about half the space of compressing each file alone. `--records files` writes format 1
instead, every file its own zip member (browsable in any zip tool); both read back alike.

The runs are those the tables' selection chose, per method, dataset, algorithm, test
environment and trial, plus, for leave-one-domain-out, the pair runs that validated them.
Selection among draws compares validation accuracies, so keeping only the chosen draw
changes no cell: `domaingen collect --input_dir FILE.zip` (or the unpacked folder)
reprints the same tables, for the methods the bundle holds. `--no_weights` leaves the
.pt files out (a small archive of records); `--all_runs` keeps every run directory's records
(incomplete runs too), so that every view of `collect` reprints from the bundle; `--backs PATH`
records which committed files the records back (`domaingen check-results`). A bundle whose files do not match bundle.json
(a damaged zip, an edited file) is refused in one line and nothing is written.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

import pandas as pd

import domaingen
from domaingen.errors import DomaingenError
from domaingen.run.manifest import MANIFEST
from domaingen.run.rundir import ARGS, CHECKPOINT, DONE, FINAL, LOG, RESULTS, SELECTED
from domaingen.tables.collect import ADAPTED_FILES, Collection, collect, table_records
from domaingen.tables.selection import select, selection_method, training_domain_validation
from domaingen.tables.wilds_selection import wilds_select

BUNDLE_FILE = "bundle.json"
RECORDS = "records.tar.xz"
# bundle.json's "format": how the records are laid out in the zip
FORMATS = {"files": 1, "solid": 2}
DIAGNOSTICS = "diagnostics.json"
RUN_FILES = (ARGS, MANIFEST, RESULTS, FINAL, LOG, DONE, DIAGNOSTICS)
RUNS = "runs"
SWEEP_FILE = "sweep.json"  # the sweep's recorded spec (sweep.spec.SPEC_FILE; tables do not import sweep)

README = """# {name}: a domaingen bundle

{intro}
`tables.md` holds the tables as collect printed them from the whole sweep.

Reprint them from this bundle (the zip or this folder):

    domaingen collect --input_dir {name}.zip

{records_note}Reload a run's selected weights and evaluate every split again (`--data_dir` names
where the dataset lives on your machine, when not where the run was trained):

    domaingen evaluate {name}/runs/RUN [--data_dir DIR] [--checkpoint selected|last]

`selected.pt` holds the weights at the checkpoint training-domain validation chose;
`checkpoint.pt`, kept for runs whose chosen checkpoint is their last one (oracle, last),
the last checkpoint. bundle.json lists, per run, the methods that chose it, the step each
chose, and the SHA-256 of every file.
"""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _base(run: str) -> str:
    """'RUN#mode' (a test-time mode's rows) -> 'RUN', the directory."""
    return run.split("#", 1)[0]


def chosen_runs(collection: Collection, methods: Sequence[str], hparams_choice: str) -> dict[str, dict[str, int]]:
    """run directory -> {method: the step it chose} for every run the tables of `methods` rest on.

    A method that validates on pair runs (leave-one-domain-out) reads those of the chosen draw;
    they come with it (step -1: chosen for validation). WILDS' official-split tables add their runs.
    """
    records = table_records(collection)
    chosen: dict[str, dict[str, int]] = {}
    for method in methods:
        picked = select(records, method, hparams_choice)
        for row in picked.itertuples():
            chosen.setdefault(_base(str(row.run)), {})[method] = int(row.step)
        if selection_method(method).pairs and len(picked):
            chosen_pairs = _pair_runs(collection.records, picked, records)
            for run in chosen_pairs:
                chosen.setdefault(run, {}).setdefault(method, -1)
    if any(c.startswith("wilds_") for c in collection.records.columns):
        for row in wilds_select(collection.records).itertuples():
            chosen.setdefault(str(row.run), {})["wilds"] = int(row.step)
    return chosen


def _pair_runs(records: pd.DataFrame, picked: pd.DataFrame, expanded: pd.DataFrame) -> set[str]:
    bases = (expanded.groupby("algorithm")["base_algorithm"].first().dropna().to_dict()
             if "base_algorithm" in expanded else {})
    pairs = records[records["test_envs"].map(len) == 2].drop_duplicates("run")
    wanted = {(r.dataset, bases.get(r.algorithm, r.algorithm), int(r.hparams_seed), int(r.trial_seed), int(r.test_env))
              for r in picked.itertuples()}
    return {str(p.run) for p in pairs.itertuples() for t in p.test_envs
            if (p.dataset, p.algorithm, int(p.hparams_seed), int(p.trial_seed), int(t)) in wanted}


def _weights_for(run_dir: Path, steps: dict[str, int], last_step: int, selected_step: int | None) -> list[str]:
    """selected.pt always; checkpoint.pt when a method chose the last step and selected.pt is another one."""
    files = [SELECTED] if (run_dir / SELECTED).exists() else []
    if (run_dir / CHECKPOINT).exists() and last_step in steps.values() and selected_step != last_step:
        files.append(CHECKPOINT)
    return files


def _runs_table(collection: Collection) -> list[dict[str, Any]]:
    runs = collection.runs.astype(object).where(collection.runs.notna(), None)
    rows = runs.to_dict("records")
    for row in rows:
        row["test_envs"] = list(row.get("test_envs") or ())
    return rows


INTRO_SELECTED = """The runs that `domaingen collect` selected from the sweep `{source}` with {methods}
(hparams chosen {choice}): {n_runs} of its {done_runs} done runs, with their arguments,
manifests (code, library and device versions), records and logs{weights_note}."""
INTRO_ALL_RUNS = """Every run of the sweep `{source}` ({n_dirs} run directories, {done_runs} of them done), with its
arguments, manifest (code, library and device versions), records and log; `domaingen collect` with
{methods} (hparams chosen {choice}) selected {n_runs} of the done runs{weights_note}."""


def bundled_run_dirs(info: dict[str, Any]) -> int:
    """How many run directories a bundle's bundle.json lists files of."""
    return len({arc.split("/")[1] for arc in info["files"] if arc.startswith(f"{RUNS}/")})


RECORDS_NOTE = """The records (arguments, manifests, results, logs) are in `records.tar.xz`, compressed
together; unpack them beside the weights to evaluate a run from the folder:

    tar -xJf {name}/records.tar.xz -C {name}

"""


def _solid_records(members: dict[str, Path]) -> bytes:
    """A tar.xz of `members` (arc name -> file), one LZMA stream at xz's strongest preset: the
    records of many runs share their keys and arguments. Owners are left out; times are kept."""
    def anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=9 | lzma.PRESET_EXTREME) as tar:
        for arc, path in sorted(members.items()):
            tar.add(path, arcname=arc, recursive=False, filter=anonymous)
    return buffer.getvalue()


def _intro(info: dict[str, Any], methods: Sequence[str], hparams_choice: str, n_chosen: int, n_dirs: int) -> str:
    """The README's first paragraph: which runs' records the bundle holds (every run's under --all_runs)."""
    fields = dict(source=info["source"], methods=", ".join(methods), choice=hparams_choice.replace("_", " "),
                  n_runs=n_chosen, done_runs=info["done_runs"], n_dirs=n_dirs)
    template = INTRO_ALL_RUNS if info["all_runs"] else INTRO_SELECTED
    if not info["weights"]:
        note = " (no weights: exported with --no_weights)"
    else:
        note = ", whose selected weights are here too" if info["all_runs"] else ", and their selected weights"
    return template.format(weights_note=note, **fields)


def export_bundle(input_dir: str | os.PathLike, output: str | os.PathLike, collection: Collection,
                  methods: Sequence[str], hparams_choice: str, tables_text: str, weights: bool = True,
                  backs: Sequence[str] = (), all_runs: bool = False, records: str = "solid") -> dict[str, Any]:
    """Write the bundle of what `collection`'s tables selected to `output` (a .zip); returns its bundle.json.

    `backs` names the files (under results/) whose records these are; `all_runs` bundles every
    run directory's records, the runs no table selected and the incomplete ones included.
    `records`: "solid" (format 2) compresses every file but the weights together into records.tar.xz;
    "files" (format 1) zips each file on its own.
    The zip is written through a temporary file and a rename: a failure leaves nothing behind.
    """
    source, output = Path(input_dir), Path(output)
    if output.suffix != ".zip":
        raise DomaingenError(f"--output {output}: name a .zip file")
    if records not in FORMATS:
        raise DomaingenError(f"--records {records}: choose {' or '.join(FORMATS)}")
    chosen = chosen_runs(collection, methods, hparams_choice)
    if not chosen:
        raise DomaingenError(f"the tables of {source} selected no run with {', '.join(methods)}; "
                             "try another --selection")
    last_steps = collection.records.groupby("run")["step"].max().to_dict()
    training_steps = training_domain_validation(collection.records).drop_duplicates("run").set_index("run")["step"]
    name = output.stem
    members: dict[str, Path] = {}
    runs_info: dict[str, Any] = {}
    # every done run's small files (the candidates selection compared, so the tables, their
    # tie marks included, come out the same from the bundle), weights of the chosen runs only
    runs = set(collection.records["run"].astype(str)) | set(chosen)
    if all_runs:
        runs |= {p.name for p in source.iterdir() if (p / ARGS).is_file()}
    for run in sorted(runs):
        run_dir = source / run
        files = [f for f in RUN_FILES if (run_dir / f).exists()]
        files += sorted(p.name for p in run_dir.glob(ADAPTED_FILES))  # test-time adaptation results
        if run in chosen and weights:
            selected_step = int(training_steps[run]) if run in training_steps.index else None
            files += _weights_for(run_dir, chosen[run], int(last_steps.get(run, -1)), selected_step)
        for f in files:
            members[f"{RUNS}/{run}/{f}"] = run_dir / f
        if run in chosen:
            runs_info[run] = {"chosen_by": chosen[run]}
    if (source / SWEEP_FILE).exists():
        members[SWEEP_FILE] = source / SWEEP_FILE
    info = {
        "format": FORMATS[records],
        "domaingen": domaingen.__version__,
        "source": source.resolve().name,
        "selection": list(methods),
        "hparams_choice": hparams_choice,
        "weights": weights,
        "done_runs": int(collection.records["run"].nunique()),
        "runs": _runs_table(collection),
        "failed": [list(f) for f in collection.failed],
        "incomplete": list(collection.incomplete),
        "bundled": runs_info,
        "backs": sorted(backs),
        "all_runs": all_runs,
    }
    texts = {
        "tables.md": tables_text,
        "README.md": README.format(
            name=name, intro=_intro(info, methods, hparams_choice, len(chosen), len(runs)),
            records_note=RECORDS_NOTE.format(name=name) if records == "solid" else ""),
    }
    info["files"] = {arc: _sha256(path) for arc, path in members.items()}
    info["files"].update({arc: hashlib.sha256(text.encode()).hexdigest() for arc, text in texts.items()})
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.")
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(f"{name}/{BUNDLE_FILE}", json.dumps(info, indent=2, sort_keys=True) + "\n")
            for arc, text in texts.items():
                zf.writestr(f"{name}/{arc}", text)
            plain = members
            if records == "solid":
                plain = {arc: path for arc, path in members.items() if path.suffix == ".pt"}
                solid = {arc: path for arc, path in members.items() if arc not in plain}
                zf.writestr(f"{name}/{RECORDS}", _solid_records(solid), compress_type=zipfile.ZIP_STORED)
            for arc, path in sorted(plain.items()):
                zf.write(path, f"{name}/{arc}")
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return info


# ---- reading a bundle -------------------------------------------------------------------


def is_bundle(path: str | os.PathLike) -> bool:
    """A .zip file, or a folder holding bundle.json."""
    path = Path(path)
    return (path.is_file() and path.suffix == ".zip") or (path / BUNDLE_FILE).is_file()


def _damaged(path: Path, why: str) -> DomaingenError:
    return DomaingenError(f"{path} is not a usable domaingen bundle ({why}); export it again with domaingen export")


def _read_info(path: Path, text: bytes | str) -> dict[str, Any]:
    try:
        info = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _damaged(path, f"{BUNDLE_FILE} is not valid JSON") from None
    if (not isinstance(info, dict) or info.get("format") not in FORMATS.values()
            or not isinstance(info.get("files"), dict)):
        raise _damaged(path, f"{BUNDLE_FILE} is not one domaingen {domaingen.__version__} writes")
    return info


def _small_files(info: dict[str, Any], path: Path) -> dict[str, str]:
    """arc -> SHA-256 of every file but the weights, refusing a name that points outside the bundle."""
    wanted = {}
    for arc, digest in info["files"].items():
        if Path(arc).suffix == ".pt":
            continue
        if Path(arc).is_absolute() or ".." in Path(arc).parts:
            raise _damaged(path, f"{arc} points outside the bundle")
        wanted[arc] = digest
    return wanted


def _write_checked(path: Path, arc: str, data: bytes, digest: str, into: Path) -> None:
    if hashlib.sha256(data).hexdigest() != digest:
        raise _damaged(path, f"{arc} does not match its checksum")
    target = into / arc
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def _extract_records(path: Path, records: IO[bytes], wanted: dict[str, str], into: Path) -> None:
    """Check and extract the files of `wanted` (arc -> SHA-256) that records.tar.xz holds, read as a stream;
    drops them from `wanted`."""
    try:
        # tarfile's own xz stream ends quietly where a truncated file ends (at a member boundary, the
        # archive just looks shorter); lzma's raises EOFError unless it reaches xz's end-of-stream marker
        with lzma.open(records) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if member.isfile() and member.name in wanted:
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    _write_checked(path, member.name, data, wanted.pop(member.name), into)
            while stream.read(1 << 20):  # read to the marker: a cut in the tar's trailing padding raises too
                pass
    except (tarfile.TarError, lzma.LZMAError, EOFError) as exc:
        raise _damaged(path, f"damaged: {RECORDS}: {exc}") from None


def _extract_small_files(path: Path, into: Path) -> tuple[dict[str, Any], Path]:
    """Check a zipped bundle and extract all but its weights into `into`; (bundle.json, the bundle's folder)."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise _damaged(path, f"not a zip file: {exc}") from None
    with zf:
        names = set(zf.namelist())
        infos = [n for n in names if n.endswith(f"/{BUNDLE_FILE}") and n.count("/") == 1]
        if len(infos) != 1:
            raise _damaged(path, f"no {BUNDLE_FILE} in a top folder")
        top = infos[0].split("/")[0]
        try:
            info = _read_info(path, zf.read(infos[0]))
            wanted = _small_files(info, path)
            for arc in [a for a in wanted if f"{top}/{a}" in names]:
                _write_checked(path, arc, zf.read(f"{top}/{arc}"), wanted.pop(arc), into)
            if wanted and info["format"] == FORMATS["solid"] and f"{top}/{RECORDS}" in names:
                with zf.open(f"{top}/{RECORDS}") as records:
                    _extract_records(path, records, wanted, into)
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise _damaged(path, f"damaged: {exc}") from None
        # what `wanted` still holds was found neither as a zip member nor in records.tar.xz
        missing = list(wanted) + [a for a in info["files"] if Path(a).suffix == ".pt" and f"{top}/{a}" not in names]
        if missing:
            raise _damaged(path, f"{sorted(missing)[0]} is missing")
    return info, into


def _check_folder(path: Path) -> dict[str, Any]:
    info = _read_info(path, (path / BUNDLE_FILE).read_bytes())
    for arc, digest in info["files"].items():
        file = path / arc
        if not file.is_file():
            raise _damaged(path, f"{arc} is missing")
        if file.suffix != ".pt" and _sha256(file) != digest:
            raise _damaged(path, f"{arc} does not match its checksum")
    return info


def _records_packed(path: Path) -> bool:
    """An unpacked format-2 bundle whose records.tar.xz was not unpacked (no runs/RUN/args.json beside it)."""
    return (path / RECORDS).is_file() and not any((path / RUNS).glob(f"*/{ARGS}"))


def _extract_folder_records(path: Path, into: Path) -> dict[str, Any]:
    """Check a folder's records.tar.xz (and its plain files) and extract all but the weights into `into`."""
    info = _read_info(path, (path / BUNDLE_FILE).read_bytes())
    wanted = _small_files(info, path)
    for arc in [a for a in wanted if (path / a).is_file()]:
        _write_checked(path, arc, (path / arc).read_bytes(), wanted.pop(arc), into)
    with open(path / RECORDS, "rb") as records:
        _extract_records(path, records, wanted, into)
    if wanted:
        raise _damaged(path, f"{sorted(wanted)[0]} is missing")
    return info


def copy_weights(path: str | os.PathLike, info: dict[str, Any], arcs: Sequence[str], into: Path) -> None:
    """Copy a bundle's (zip or folder) weight files `arcs` (runs/RUN/NAME.pt) to `into`/arc, each checked
    against the SHA-256 bundle.json records for it."""
    path = Path(path)

    def check(arc: str, target: Path) -> None:
        if _sha256(target) != info["files"].get(arc):
            target.unlink()
            raise _damaged(path, f"{arc} does not match its checksum")

    if path.is_dir():
        for arc in arcs:
            (into / arc).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path / arc, into / arc)
            check(arc, into / arc)
        return
    try:
        with zipfile.ZipFile(path) as zf:
            top = next(n for n in zf.namelist() if n.endswith(f"/{BUNDLE_FILE}") and n.count("/") == 1).split("/")[0]
            for arc in arcs:
                (into / arc).parent.mkdir(parents=True, exist_ok=True)
                with zf.open(f"{top}/{arc}") as source, open(into / arc, "wb") as target:
                    shutil.copyfileobj(source, target, 1 << 20)
                check(arc, into / arc)
    except (zipfile.BadZipFile, zlib.error, EOFError, KeyError, StopIteration) as exc:
        raise _damaged(path, f"damaged: {exc}") from None


@dataclass
class Bundle:
    """A checked bundle: its bundle.json and the folder its runs are in (a temporary one for a zip)."""

    info: dict[str, Any]
    root: Path


@contextmanager
def open_bundle(path: str | os.PathLike) -> Iterator[Bundle]:
    """Check a bundle (zip or folder) and yield it; a zip's files other than weights are extracted
    into a temporary folder, removed afterwards. Raises DomaingenError for a damaged bundle."""
    path = Path(path)
    if path.is_dir() and not _records_packed(path):
        yield Bundle(_check_folder(path), path)
        return
    tmp = Path(tempfile.mkdtemp(prefix="domaingen-bundle-"))
    try:
        if path.is_dir():
            yield Bundle(_extract_folder_records(path, tmp), tmp)
        else:
            info, root = _extract_small_files(path, tmp)
            yield Bundle(info, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bundle_collection(path: str | os.PathLike, allow_mixed_sources: bool = False) -> tuple[Collection, dict[str, Any]]:
    """The Collection of a bundle's runs, with the sweep's grid of runs (states, failures) as exported,
    so that collect tabulates it as it tabulated the sweep; and its bundle.json."""
    with open_bundle(path) as bundle:
        runs_dir = bundle.root / RUNS
        if not runs_dir.is_dir():
            raise _damaged(Path(path), f"no {RUNS}/ folder")
        collection = collect(runs_dir, allow_mixed_sources=allow_mixed_sources)
        runs = pd.DataFrame(bundle.info.get("runs", []))
        if len(runs):
            runs["test_envs"] = runs["test_envs"].map(lambda e: tuple(sorted(e or ())))
            collection.runs = runs
        collection.failed = [tuple(f) for f in bundle.info.get("failed", [])]
        collection.incomplete = list(bundle.info.get("incomplete", []))
    return collection, bundle.info
