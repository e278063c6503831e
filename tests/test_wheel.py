"""The sweep specs as package data: `domaingen spec` in this checkout reads every sweeps/*.toml
byte for byte, and a built sdist and wheel hold them as domaingen/specs/ (installing the wheel
and running it is `make wheel-check`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from domaingen.cli import main

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "sweeps").glob("*.toml"))
NAMES = [path.stem for path in SPECS]


def test_the_package_folder_of_specs_is_the_top_level_sweeps():
    assert (ROOT / "domaingen" / "specs").is_symlink()
    assert (ROOT / "domaingen" / "specs").resolve() == (ROOT / "sweeps").resolve()


def test_spec_lists_every_shipped_spec_with_its_first_comment_line(capsys):
    assert main(["spec"]) == 0
    table = capsys.readouterr().out.split("\n\n")[0].splitlines()[2:]  # below the header and its rule
    rows = {line.split()[0]: line for line in table}
    assert list(rows) == NAMES
    first = (ROOT / "sweeps" / "demo.toml").read_text().splitlines()[0].removeprefix("# ")
    assert rows["demo"].split(None, 1)[1].strip() == first


@pytest.mark.parametrize("name", ["demo", "quick.toml"])
def test_spec_name_prints_the_file(capsys, name):
    assert main(["spec", name]) == 0
    assert capsys.readouterr().out == (ROOT / "sweeps" / f"{name.removesuffix('.toml')}.toml").read_text()


def test_spec_output_copies_every_spec_byte_for_byte(tmp_path, capsys):
    for path in SPECS:
        out = tmp_path / path.name
        assert main(["spec", path.stem, "--output", str(out)]) == 0
        assert out.read_bytes() == path.read_bytes()
    assert capsys.readouterr().out.splitlines() == [f"wrote {tmp_path / path.name}" for path in SPECS]


def test_unknown_spec_names_every_valid_one_in_one_line(capsys):
    assert main(["spec", "demoo"]) == 2
    err = capsys.readouterr().err
    assert err == f"domaingen: error: no shipped spec 'demoo'; choose one of: {', '.join(NAMES)}\n"


def test_output_without_a_name_says_how(tmp_path, capsys):
    assert main(["spec", "--output", str(tmp_path / "x.toml")]) == 2
    assert capsys.readouterr().err == "domaingen: error: --output needs a spec's NAME: domaingen spec NAME --output FILE\n"
    assert not (tmp_path / "x.toml").exists()


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("build", "wheel")),
                    reason="needs the build and wheel packages (make install-all)")
def test_built_sdist_and_wheel_hold_every_spec(tmp_path):
    """python -m build, as make wheel-check runs it (about 3 s): both archives hold each spec's bytes."""
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("domaingen_bench-*-py3-none-any.whl")
    (sdist,) = tmp_path.glob("domaingen_bench-*.tar.gz")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {Path(n).stem: archive.read(n) for n in archive.namelist() if n.startswith("domaingen/specs/")}
        entry_points = next(n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
        assert "domaingen = domaingen.cli:main" in archive.read(entry_points).decode()
    assert shipped == {path.stem: path.read_bytes() for path in SPECS}
    with tarfile.open(sdist) as archive:
        members = {Path(m.name).stem: m for m in archive.getmembers() if "/domaingen/specs/" in m.name}
        assert sorted(members) == NAMES and all(m.isfile() for m in members.values())
        assert archive.extractfile(members["demo"]).read() == (ROOT / "sweeps" / "demo.toml").read_bytes()


def test_sweep_launch_takes_a_shipped_spec_by_name(tmp_path, capsys, monkeypatch):
    from domaingen.cli.main import main

    monkeypatch.chdir(tmp_path)  # no demo.toml here: the name is the shipped spec's
    assert main(["-q", "sweep", "launch", "--spec", "demo", "--output_dir", str(tmp_path / "s"), "--dry"]) == 0
    by_name = capsys.readouterr().out
    repo_spec = str(Path(__file__).resolve().parents[1] / "sweeps" / "demo.toml")
    assert main(["-q", "sweep", "launch", "--spec", repo_spec, "--output_dir", str(tmp_path / "s"), "--dry"]) == 0
    assert by_name == capsys.readouterr().out and "72 jobs" in by_name
    assert main(["-q", "sweep", "launch", "--spec", "nothere", "--output_dir", str(tmp_path / "s"), "--dry"]) == 2
    assert capsys.readouterr().err == ("domaingen: error: sweep spec nothere not found (`domaingen spec` lists the "
                                       "specs --spec takes by name)\n")
