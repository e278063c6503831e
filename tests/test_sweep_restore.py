"""domaingen sweep restore: a sweep continued from its exported bundle ends as the sweep run in one go."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from domaingen.cli import main

SPEC = """
algorithms = ["ERM"]
datasets = ["ColoredMNIST"]
test_envs = [[2]]
n_hparams = 1
n_trials = 2
steps = 3
checkpoint_freq = 2

[hparams]
featurizer = "MLP"
mlp_width = 16
batch_size = 16

[[parts]]
[[parts]]
[parts.hparams]
featurizer = "MLP"
mlp_width = 16
batch_size = 16
lr = 0.01
"""


def run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["-q", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def launch(capsys, spec: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    return run(capsys, "sweep", "launch", "--spec", str(spec), "--output_dir", str(out), "--data_dir", "embedded",
               "--launcher", "local", "--no_progress", "--yes", *extra)


def runs_of(sweep: Path) -> dict[tuple[float, int], str]:
    """(lr, trial) -> run id of a sweep directory's run directories."""
    found = {}
    for args in sweep.glob("*/args.json"):
        a = json.loads(args.read_text())
        found[(a["hparams"].get("lr", 0.0), a["trial_seed"])] = args.parent.name
    return found


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> tuple[Path, Path]:
    """The spec (2 parts x 2 trials) and its sweep run in one go."""
    root = tmp_path_factory.mktemp("restore")
    (root / "spec.toml").write_text(SPEC)
    code = main(["-q", "sweep", "launch", "--spec", str(root / "spec.toml"), "--output_dir", str(root / "whole"),
                 "--data_dir", "embedded", "--launcher", "local", "--no_progress", "--yes"])
    assert code == 0 and len(list((root / "whole").glob("*/done"))) == 4
    return root / "spec.toml", root / "whole"


@pytest.fixture(scope="module")
def bundle(whole, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A bundle (records only) of the sweep stopped early: part 1's trial 1 not launched, part 2's trial 1
    incomplete; and the run ids by role."""
    spec, sweep = whole
    root = tmp_path_factory.mktemp("partial")
    partial = root / "partial"
    shutil.copytree(sweep, partial)
    ids = sorted(runs_of(partial).items())
    roles = {"p1t0": ids[0][1], "p1t1": ids[1][1], "p2t0": ids[2][1], "p2t1": ids[3][1]}
    assert [k for k, _ in ids] == [(0.0, 0), (0.0, 1), (0.01, 0), (0.01, 1)]
    shutil.rmtree(partial / roles["p1t1"])
    (partial / roles["p2t1"] / "done").unlink()
    assert main(["-q", "export", "--input_dir", str(partial), "--output", str(root / "b.zip"), "--no_weights",
                 "--all_runs"]) == 0
    return root / "b.zip", roles


def accuracies(run_dir: Path) -> list[dict[str, float]]:
    """Each record's step, loss and accuracies (not its times or paths)."""
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k in ("step", "loss") or k.endswith("_acc")} for r in records]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_restored_sweep_continues_and_ends_as_the_sweep_run_in_one_go(whole, bundle, tmp_path, capsys):
    spec, sweep = whole
    zipped, roles = bundle
    out = tmp_path / "continued"
    code, text, _ = run(capsys, "sweep", "restore", "--bundle", str(zipped), "--output_dir", str(out))
    assert code == 0
    assert text.splitlines()[:2] == [
        f"restored 2 done runs and its sweep.json from {zipped} into {out}",
        "1 of its runs were not done (incomplete or failed) and are not restored: sweep launch runs them from the start",
    ]
    assert sorted(p.name for p in out.iterdir()) == sorted([roles["p1t0"], roles["p2t0"], "sweep.json"])
    for run_id in (roles["p1t0"], roles["p2t0"]):  # the records as the sweep wrote them
        for name in ("args.json", "results.jsonl", "manifest.json", "done"):
            assert _sha(out / run_id / name) == _sha(sweep / run_id / name)
    assert json.loads((out / "sweep.json").read_text()) == json.loads((sweep / "sweep.json").read_text())
    # part 2 alone: one of its jobs done, the other run again; the whole sweep's record stays
    code, text, _ = launch(capsys, spec, out, "--parts", "2")
    assert code == 0 and text.splitlines()[:2] == [
        f"these jobs are part of the sweep {out}/sweep.json records: its record is kept (--force records this "
        "spec instead)",
        "2 jobs: 1 done, 0 incomplete (to resume), 0 failed (skipped; --retry_failed reruns them), 1 not launched",
    ]
    assert (out / "sweep.json").read_bytes() == (sweep / "sweep.json").read_bytes()
    code, text, _ = launch(capsys, spec, out)
    assert code == 0 and "4 jobs: 3 done" in text and "launched 1 jobs: 1 done" in text
    # every run now as in the sweep run in one go (same seeds, same code), so the tables are the same
    for run_id in roles.values():
        assert accuracies(out / run_id) == accuracies(sweep / run_id) and "env0_out_acc" in accuracies(sweep / run_id)[-1]
    tables = [run(capsys, "collect", "--input_dir", str(d), "--format", "csv")[1] for d in (sweep, out)]
    assert tables[0] == tables[1]
    # restoring again writes nothing
    before = {p: _sha(p) for p in out.rglob("*") if p.is_file()}
    code, text, _ = run(capsys, "sweep", "restore", "--bundle", str(zipped), "--output_dir", str(out))
    assert code == 0 and text.splitlines()[:2] == [
        f"restored 0 done runs from {zipped} into {out}",
        "2 of the bundle's done runs were there already and are left as they are",
    ]
    assert {p: _sha(p) for p in out.rglob("*") if p.is_file()} == before


def test_a_bundle_with_weights_restores_them_checked(whole, tmp_path, capsys):
    _, sweep = whole
    assert run(capsys, "export", "--input_dir", str(sweep), "--output", str(tmp_path / "w.zip"))[0] == 0
    with zipfile.ZipFile(tmp_path / "w.zip") as zf:
        weights = [n.split("/", 1)[1] for n in zf.namelist() if n.endswith(".pt")]
        zf.extractall(tmp_path / "unpacked")
    assert weights
    for source in (tmp_path / "w.zip", tmp_path / "unpacked" / "w"):
        out = tmp_path / f"from_{source.suffix or 'folder'}"
        code, text, _ = run(capsys, "sweep", "restore", "--bundle", str(source), "--output_dir", str(out))
        runs = {arc.split("/")[1] for arc in weights}
        assert code == 0 and text.startswith(f"restored 4 done runs ({len(runs)} with weights) and its sweep.json")
        for arc in weights:  # runs/RUN/NAME.pt, restored as RUN/NAME.pt with the sweep's bytes
            assert _sha(out / arc.split("/", 1)[1]) == _sha(sweep / arc.split("/", 1)[1])
    # a weight file changed after export: refused in one line, nothing written
    victim = tmp_path / "unpacked" / "w" / weights[0]
    victim.write_bytes(victim.read_bytes()[:-1] + bytes([victim.read_bytes()[-1] ^ 1]))
    out = tmp_path / "damaged"
    code, _, err = run(capsys, "sweep", "restore", "--bundle", str(tmp_path / "unpacked" / "w"), "--output_dir",
                       str(out))
    assert code == 2 and err.strip() == (f"domaingen: error: {tmp_path / 'unpacked' / 'w'} is not a usable domaingen "
                                         f"bundle ({weights[0]} does not match its checksum); export it again with "
                                         "domaingen export")
    assert not out.exists()


def test_a_missing_bundle_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "new"
    code, text, err = run(capsys, "sweep", "restore", "--bundle", str(tmp_path / "nope.zip"), "--output_dir", str(out))
    assert code == 2 and text == "" and err.strip() == (
        f"domaingen: error: {tmp_path / 'nope.zip'}: no such bundle; give a FILE.zip that domaingen export wrote, "
        "or its unpacked folder")
    assert not out.exists()


def test_a_directory_holding_another_sweep_is_refused_in_one_line(bundle, tmp_path, capsys):
    zipped, _ = bundle
    out = tmp_path / "other"
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"algorithms": ["IRM"], "datasets": ["ColoredMNIST"]}))
    code, _, err = run(capsys, "sweep", "restore", "--bundle", str(zipped), "--output_dir", str(out))
    assert code == 2 and err.strip() == (f"domaingen: error: {out} holds another sweep than {zipped} (sweep.json "
                                         "differs); restore into an empty --output_dir")
    assert [p.name for p in out.iterdir()] == ["sweep.json"]


def test_a_larger_spec_than_the_recorded_one_is_still_refused(whole, tmp_path, capsys):
    spec, _ = whole
    out = tmp_path / "part1"
    assert launch(capsys, spec, out, "--parts", "1", "--steps", "1")[0] == 0  # records part 1, 1 step
    code, _, err = launch(capsys, spec, out, "--steps", "1")
    assert code == 2 and "holds a sweep with a different spec (parts: [{" in err and len(err.splitlines()) == 1


def test_a_bundle_without_runs_is_refused_in_one_line_and_nothing_is_written(bundle, tmp_path, capsys):
    with zipfile.ZipFile(bundle[0]) as zf:  # unpacked, then its records and their checksums left out
        zf.extractall(tmp_path / "unpacked")
    folder = tmp_path / "unpacked" / "b"
    info = json.loads((folder / "bundle.json").read_text())
    info["files"] = {arc: digest for arc, digest in info["files"].items() if (folder / arc).is_file()}
    (folder / "bundle.json").write_text(json.dumps(info))
    (folder / "records.tar.xz").unlink()
    out = tmp_path / "new"
    code, text, err = run(capsys, "sweep", "restore", "--bundle", str(folder), "--output_dir", str(out))
    assert code == 2 and text == "" and err.strip() == (
        f"domaingen: error: {folder} holds no runs to restore (no runs/ folder)")
    assert not out.exists()
