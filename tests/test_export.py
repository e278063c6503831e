"""domaingen export: a bundle of what the tables selected, collected and evaluated after the sweep is gone."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from domaingen.cli import main

SPEC = """
algorithms = ["ERM"]
datasets = ["ColoredMNIST"]
n_hparams = 2
n_trials = 1
steps = 3
checkpoint_freq = 2
pairs = true

[hparams]
featurizer = "MLP"
mlp_width = 16
batch_size = 16
"""


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export")
    (root / "spec.toml").write_text(SPEC)
    assert main(["-q", "sweep", "launch", "--spec", str(root / "spec.toml"), "--output_dir", str(root / "sweep"),
                 "--data_dir", "embedded", "--launcher", "local", "--no_progress", "--yes"]) == 0
    return root / "sweep"


def tables_part(text: str) -> str:
    """The tables, without the footer's run counts (a bundle holds fewer runs than the sweep)."""
    return text.split("± = ")[0]


def test_a_bundle_of_all_runs_says_it_holds_every_run_directory(sweep, tmp_path, capsys):
    """--all_runs bundles every run directory's records, an incomplete one included: the message and the
    README count the directories (12, one of them made incomplete here) apart from those selection chose."""
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy)
    unfinished = sorted(p for p in copy.iterdir() if (p / "done").is_file())[0]
    for name in ("done", "final.json"):
        (unfinished / name).unlink(missing_ok=True)
    code, out, _ = run(capsys, "export", "--input_dir", str(copy), "--output", str(tmp_path / "all.zip"),
                       "--all_runs", "--no_weights")
    with zipfile.ZipFile(tmp_path / "all.zip") as zf:
        info = json.loads(zf.read("all/bundle.json"))
        readme = zf.read("all/README.md").decode()
    n_dirs = len({arc.split("/")[1] for arc in info["files"] if arc.startswith("runs/")})
    assert code == 0 and n_dirs == 12 and unfinished.name in {a.split("/")[1] for a in info["files"] if "/" in a}
    chosen = len(info["bundled"])
    assert out.startswith(f"wrote {tmp_path / 'all.zip'}: the records of all 12 runs (11 done), {chosen} of them "
                          "selected by ")
    assert ("Every run of the sweep `sweep` (12 run directories, 11 of them done), with its\narguments, manifest"
            in readme)
    assert f"selected {chosen} of the done runs (no weights: exported with --no_weights)." in readme


def test_a_bundle_reprints_the_tables_and_evaluates_after_the_sweep_is_deleted(sweep, tmp_path, capsys):
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy)
    code, markdown, _ = run(capsys, "collect", "--input_dir", str(copy))
    code, csv_text, _ = run(capsys, "collect", "--input_dir", str(copy), "--format", "csv")
    code, out, _ = run(capsys, "export", "--input_dir", str(copy), "--output", str(tmp_path / "b.zip"))
    assert code == 0 and out.startswith(f"wrote {tmp_path / 'b.zip'}: ")
    shutil.rmtree(copy)
    code, again, _ = run(capsys, "collect", "--input_dir", str(tmp_path / "b.zip"))
    assert code == 0 and tables_part(again) == tables_part(markdown)
    assert ("Read from a bundle of sweep sweep: the records of its 12 done runs, and the weights of the runs its "
            "tables selected.") in again
    code, csv_again, _ = run(capsys, "collect", "--input_dir", str(tmp_path / "b.zip"), "--format", "csv")
    assert csv_again == csv_text
    cells = pd.read_csv(io.StringIO(csv_text))
    # the selected runs are all there, and only they with the pair runs that validated them
    with zipfile.ZipFile(tmp_path / "b.zip") as zf:
        names = zf.namelist()
        info = json.loads(zf.read("b/bundle.json"))
        zf.extractall(tmp_path / "unpacked")
    # the unzipped folder collects the same with its records still packed, then unpacked as its README says
    code, packed, _ = run(capsys, "collect", "--input_dir", str(tmp_path / "unpacked" / "b"))
    assert code == 0 and tables_part(packed) == tables_part(markdown)
    assert "tar -xJf b/records.tar.xz -C b" in (tmp_path / "unpacked" / "b" / "README.md").read_text()
    with tarfile.open(tmp_path / "unpacked" / "b" / "records.tar.xz") as tar:
        records = tar.getnames()
        tar.extractall(tmp_path / "unpacked" / "b", filter="data")
    assert info["format"] == 2 and "sweep.json" in records
    selected = {r for runs in cells["runs"].dropna() for r in str(runs).split(";")}
    assert selected <= set(info["bundled"]) and len(info["bundled"]) < 12
    assert out.startswith(f"wrote {tmp_path / 'b.zip'}: {len(info['bundled'])} of 12 done runs, selected by ")
    readme = (tmp_path / "unpacked" / "b" / "README.md").read_text()
    assert f"(hparams chosen per trial): {len(info['bundled'])} of its 12 done runs, with their" in readme
    # leave-one-domain-out's cells come with the pair runs {t, v} of the draw each chose
    loo = cells[(cells["selection"] == "loo") & (cells["table"] == "test") & ~cells["column"].str.startswith("Avg")]
    envs = {"+90%": 0, "+80%": 1, "-90%": 2}
    wanted = {(int(h), tuple(sorted((envs[c], v)))) for c, h in zip(loo["column"], loo["hparams_seeds"])
              for v in range(3) if v != envs[c]}
    bundled_pairs = set()
    for r, v in info["bundled"].items():
        args = json.loads((tmp_path / "unpacked" / "b" / "runs" / r / "args.json").read_text())
        if len(args["test_envs"]) == 2:
            assert v["chosen_by"] == {"loo": -1}
            bundled_pairs.add((args["hparams_seed"], tuple(args["test_envs"])))
    assert bundled_pairs == wanted
    assert all(f"b/runs/{r}/selected.pt" in names and f"runs/{r}/manifest.json" in records for r in selected)
    assert {"b/README.md", "b/tables.md", "b/records.tar.xz"} <= set(names)
    assert not [n for n in names if n.endswith(".jsonl")] and not [r for r in records if r.endswith(".pt")]
    assert tables_part((tmp_path / "unpacked" / "b" / "tables.md").read_text()) == tables_part(markdown)
    # the unpacked folder collects the same, and a run in it evaluates to its record
    code, unpacked, _ = run(capsys, "collect", "--input_dir", str(tmp_path / "unpacked" / "b"))
    assert tables_part(unpacked) == tables_part(markdown)
    row = cells[(cells["selection"] == "training") & (cells["table"] == "test") & (cells["column"] == "-90%")].iloc[0]
    chosen = str(row["runs"])
    code, evaluated, _ = run(capsys, "evaluate", str(tmp_path / "unpacked" / "b" / "runs" / chosen))
    assert code == 0 and "equal to the record of step" in evaluated
    test_line = next(line for line in evaluated.splitlines() if line.split()[:3] == ["2", "-90%", "test"])
    assert float(test_line.split()[3]) == pytest.approx(row["mean"], abs=5e-5)  # printed with 4 decimals


def test_no_weights_and_one_method(sweep, tmp_path, capsys):
    code, out, _ = run(capsys, "export", "--input_dir", str(sweep), "--output", str(tmp_path / "s.zip"),
                       "--selection", "training", "--no_weights")
    assert code == 0 and "without weights" in out
    with zipfile.ZipFile(tmp_path / "s.zip") as zf:
        assert not [n for n in zf.namelist() if n.endswith(".pt")]
    code, _, err = run(capsys, "collect", "--input_dir", str(tmp_path / "s.zip"), "--selection", "oracle")
    assert code == 2 and err.strip() == ("domaingen: error: this bundle holds the runs selected by training, not "
                                         "oracle; export the sweep again with --selection oracle")
    code, text, _ = run(capsys, "collect", "--input_dir", str(sweep), "--selection", "training")
    code, again, _ = run(capsys, "collect", "--input_dir", str(tmp_path / "s.zip"))
    assert tables_part(again) == tables_part(text)


def test_export_of_a_directory_without_finished_runs_writes_nothing(tmp_path, capsys):
    (tmp_path / "empty" / "run1").mkdir(parents=True)
    code, _, err = run(capsys, "export", "--input_dir", str(tmp_path / "empty"), "--output", str(tmp_path / "x.zip"))
    assert code == 2 and not (tmp_path / "x.zip").exists() and not list(tmp_path.glob(".x.zip*"))
    assert err.strip() == (f"domaingen: error: no finished runs in {tmp_path / 'empty'} (found 0 failed, 0 incomplete); "
                           "launch or resume the sweep first (domaingen sweep launch)")


@pytest.fixture(scope="module")
def small_bundle(sweep, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "s.zip"
    assert main(["-q", "export", "--input_dir", str(sweep), "--output", str(out), "--selection", "training",
                 "--no_weights", "--records", "files"]) == 0
    return out


@pytest.fixture(scope="module")
def solid_bundle(sweep, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("solid") / "s.zip"
    assert main(["-q", "export", "--input_dir", str(sweep), "--output", str(out), "--selection", "training",
                 "--no_weights"]) == 0
    return out


def _flip_a_byte(path: Path, target: Path) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(b"results.jsonl") + 300  # inside the first results.jsonl's compressed bytes
    data[at] ^= 0xFF
    target.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, why", [
    ("not a zip", "not a zip file: File is not a zip file"),
    ("truncated", "not a zip file: File is not a zip file"),
    ("flipped byte", "(damaged: "),  # zlib's error or the CRC's, as the byte falls
    ("edited file", "does not match its checksum"),
    ("no bundle.json", "no bundle.json in a top folder"),
])
def test_a_damaged_bundle_is_refused_in_one_line_and_nothing_is_written(small_bundle, tmp_path, capsys, damage, why):
    """Format 1 (--records files): every file its own zip member."""
    bad = tmp_path / "bad.zip"
    if damage == "not a zip":
        bad.write_text("hello")
    elif damage == "truncated":
        bad.write_bytes(small_bundle.read_bytes()[: small_bundle.stat().st_size // 2])
    elif damage == "flipped byte":
        _flip_a_byte(small_bundle, bad)
    else:
        with zipfile.ZipFile(small_bundle) as zf:
            zf.extractall(tmp_path / "unpacked")
        bad = tmp_path / "unpacked" / "s"
        if damage == "edited file":
            first = next((bad / "runs").iterdir()) / "results.jsonl"
            first.write_text(first.read_text().replace('"step": 2', '"step": 2 '))
        else:
            (bad / "bundle.json").unlink()
            shutil.make_archive(str(tmp_path / "bad"), "zip", tmp_path / "unpacked")
            bad = tmp_path / "bad.zip"
    before = sorted(p for p in tmp_path.rglob("*"))
    code, out, err = run(capsys, "collect", "--input_dir", str(bad), "--output", str(tmp_path / "t.md"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"domaingen: error: {bad} is not a usable domaingen bundle (") and why in err
    assert err.strip().endswith("export it again with domaingen export")
    assert sorted(p for p in tmp_path.rglob("*")) == before


def _refused(capsys, tmp_path: Path, bad: Path, why: str) -> None:
    before = sorted(p for p in tmp_path.rglob("*"))
    code, out, err = run(capsys, "collect", "--input_dir", str(bad), "--output", str(tmp_path / "t.md"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"domaingen: error: {bad} is not a usable domaingen bundle (") and why in err, err
    assert err.strip().endswith("export it again with domaingen export")
    assert sorted(p for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("damage, why", [
    ("flipped byte in the zip", "(damaged: "),
    ("truncated records", "(damaged: records.tar.xz: "),
    ("edited file", "does not match its checksum"),
    ("a record left out", "is missing"),
])
def test_a_damaged_solid_bundle_is_refused_in_one_line(solid_bundle, tmp_path, capsys, damage, why):
    """Format 2: the records in one records.tar.xz, damaged in the zip, in an unzipped folder, or once unpacked."""
    if damage == "flipped byte in the zip":
        data = bytearray(solid_bundle.read_bytes())
        with zipfile.ZipFile(solid_bundle) as zf:
            member = zf.getinfo("s/records.tar.xz")
        data[member.header_offset + 30 + len(member.filename) + len(member.extra) + member.compress_size // 2] ^= 0xFF
        bad = tmp_path / "bad.zip"
        bad.write_bytes(bytes(data))
    else:
        with zipfile.ZipFile(solid_bundle) as zf:
            zf.extractall(tmp_path / "unpacked")
        bad = tmp_path / "unpacked" / "s"
        packed = bad / "records.tar.xz"
        if damage == "truncated records":
            packed.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
        elif damage == "edited file":
            with tarfile.open(packed) as tar:
                tar.extractall(bad, filter="data")
            first = next((bad / "runs").iterdir()) / "results.jsonl"
            first.write_text(first.read_text().replace('"step": 2', '"step": 2 '))
        else:
            with tarfile.open(packed) as tar:
                kept = [m for m in tar.getmembers() if not m.name.endswith("/log.txt")]
                files = {m.name: tar.extractfile(m).read() for m in kept}
            with tarfile.open(packed, "w:xz") as tar:
                for m in kept:
                    tar.addfile(m, io.BytesIO(files[m.name]))
    _refused(capsys, tmp_path, bad, why)


def test_both_record_layouts_collect_alike_and_solid_is_smaller(small_bundle, solid_bundle, capsys):
    code, files_text, _ = run(capsys, "collect", "--input_dir", str(small_bundle), "--format", "csv")
    code, solid_text, _ = run(capsys, "collect", "--input_dir", str(solid_bundle), "--format", "csv")
    assert code == 0 and solid_text == files_text
    with zipfile.ZipFile(small_bundle) as files, zipfile.ZipFile(solid_bundle) as solid:
        assert json.loads(files.read("s/bundle.json"))["format"] == 1
        info = json.loads(solid.read("s/bundle.json"))
        # the same files, with the same checksums (the README says how to unpack): only the layout differs
        files_sums = json.loads(files.read("s/bundle.json"))["files"]
        assert info["format"] == 2 and info["files"].pop("README.md") != files_sums.pop("README.md")
        assert info["files"] == files_sums
        with tarfile.open(fileobj=solid.open("s/records.tar.xz"), mode="r|xz") as tar:
            for member in tar:
                data = tar.extractfile(member).read()
                assert member.uname == "" and member.uid == 0
                assert data == files.read(f"s/{member.name}")
    assert solid_bundle.stat().st_size < small_bundle.stat().st_size


def test_an_unknown_records_layout_is_refused_in_one_line(sweep, tmp_path, capsys):
    code, _, err = run(capsys, "export", "--input_dir", str(sweep), "--output", str(tmp_path / "x.zip"),
                       "--records", "tar")
    assert code == 2 and not (tmp_path / "x.zip").exists() and len(err.strip().splitlines()) == 1
    assert err.strip().endswith("argument --records: invalid choice: 'tar' (choose from 'solid', 'files')")


@pytest.mark.parametrize("keep", [0.1, 0.25, 0.5, 0.75, 0.9, 0.99, -1])
def test_records_cut_anywhere_are_damaged_not_missing(solid_bundle, tmp_path, capsys, keep):
    """A records.tar.xz cut at any point (a member's data, a header, the tar's trailing padding, the xz
    footer: -1 drops only the last byte) is refused as damaged, never read as a shorter archive."""
    with zipfile.ZipFile(solid_bundle) as zf:
        zf.extractall(tmp_path / "unpacked")
    bad = tmp_path / "unpacked" / "s"
    packed = bad / "records.tar.xz"
    data = packed.read_bytes()
    packed.write_bytes(data[:-1] if keep == -1 else data[: int(len(data) * keep)])
    _refused(capsys, tmp_path, bad, "(damaged: records.tar.xz: ")
