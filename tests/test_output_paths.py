"""Every command that writes to a path refuses, in one line and with exit status 2, a path through a file
and a path it cannot write, before it does any work."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from domaingen.cli.main import COMMANDS as COMMANDS_RUN
from domaingen.cli.main import OUTPUT_PATHS, main

SPEC = "algorithms = ['ERM']\ndatasets = ['ColoredMNIST']\nsteps = 2\n"

# command name -> (argv given the path, whether the path is a directory the command writes into or reads a
# sweep from (True) or a file it writes (False))
COMMANDS = {
    "train": (lambda p: ["train", "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--test_envs", "0",
                         "--data_dir", "embedded", "--output_dir", p], True),
    "sweep launch": (lambda p: ["sweep", "launch", "--spec", "{spec}", "--output_dir", p, "--dry"], True),
    "sweep status": (lambda p: ["sweep", "status", "--spec", "{spec}", "--output_dir", p], True),
    "sweep delete-incomplete": (lambda p: ["sweep", "delete-incomplete", "--spec", "{spec}", "--output_dir", p,
                                           "--yes"], True),
    "sweep restore": (lambda p: ["sweep", "restore", "--bundle", "{tmp}/b.zip", "--output_dir", p], True),
    "collect": (lambda p: ["collect", "--input_dir", "{tmp}", "--output", p], False),
    "export": (lambda p: ["export", "--input_dir", "{tmp}", "--output", p], False),
    "report": (lambda p: ["report", "{tmp}", "--output", p], True),
    "diagnose": (lambda p: ["diagnose", "{tmp}", "--output", p], False),
    "download": (lambda p: ["download", "--dataset", "pacs", "--data_dir", p], True),
    "mask-transfer": (lambda p: ["mask-transfer", "--data_dir", "embedded", "--output", p], False),
}


READS_A_SWEEP = ("sweep status", "sweep delete-incomplete")


def test_every_output_path_of_the_command_line_is_covered_here():
    assert {name for name, *_ in OUTPUT_PATHS} == set(COMMANDS)


def _unwritable(tmp_path: Path) -> Path:
    """A directory in which no file can be made: a read-only one, or for root (whom permissions do not
    stop) /sys; skips where neither refuses."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    for candidate in (locked, Path("/sys")):
        try:
            with tempfile.TemporaryFile(dir=candidate):
                pass
        except OSError:
            return candidate
    pytest.skip("no directory here refuses a new file")


def _run(command: str, path: Path, tmp_path: Path, capsys) -> tuple[int, list[str]]:
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    argv = [a.format(spec=spec, tmp=tmp_path) for a in COMMANDS[command][0](str(path))]
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines()


@pytest.mark.fast
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_path_through_a_file_is_refused_in_one_line(command, tmp_path, capsys):
    file = tmp_path / "afile"
    file.write_text("not a directory")
    is_dir = COMMANDS[command][1]
    path = file if is_dir else file / "out.txt"
    code, err = _run(command, path, tmp_path, capsys)
    assert code == 2 and len(err) == 1
    if command in READS_A_SWEEP:
        assert err[0] == (f"domaingen: error: --output_dir {file} is a file, not a sweep directory; give the "
                          "directory the sweep was launched into")
    else:
        flag = next(flag for name, _, flag, _ in OUTPUT_PATHS if name == command)
        where = f"{file} is a file" if is_dir else f"{path}: {file} is a file"
        assert err[0] == f"domaingen: error: {flag} {where}, not a directory; choose another {flag}"
    assert file.read_text() == "not a directory"


@pytest.mark.fast
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unwritable_path_is_refused_in_one_line(command, tmp_path, capsys):
    locked = _unwritable(tmp_path)
    path = locked / "new" / ("out" if COMMANDS[command][1] else "out.txt")
    code, err = _run(command, path, tmp_path, capsys)
    assert code == 2 and len(err) == 1
    if command in READS_A_SWEEP:  # these read: a sweep is not there
        assert err[0] == (f"domaingen: error: {path} holds no sweep (no such directory): give the directory a "
                          "sweep was launched into, or --spec FILE to count that spec's jobs there")
    else:
        flag = next(flag for name, _, flag, _ in OUTPUT_PATHS if name == command)
        assert err[0].startswith(f"domaingen: error: {flag} {path}: cannot write in {locked} (")
        assert err[0].endswith(f"); choose a writable {flag}")
    assert not (locked / "new").exists()


@pytest.mark.fast
def test_an_output_file_that_is_a_directory_is_refused(tmp_path, capsys):
    code, err = _run("collect", tmp_path, tmp_path, capsys)
    assert code == 2 and err == [f"domaingen: error: --output {tmp_path} is a directory; give a file name"]


@pytest.mark.fast
def test_an_os_error_the_checks_did_not_foresee_is_one_line(tmp_path, capsys, monkeypatch):
    def full(ns):
        raise OSError(28, os.strerror(28), str(tmp_path / "x"))

    monkeypatch.setitem(COMMANDS_RUN, "list", full)
    assert main(["list"]) == 2
    assert capsys.readouterr().err.strip() == f"domaingen: error: {tmp_path / 'x'}: {os.strerror(28)}"


@pytest.mark.fast
def test_a_sweep_whose_data_directory_is_missing_stops_before_launching(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DOMAINGEN_DATA", raising=False)
    spec, out, missing = tmp_path / "s.toml", tmp_path / "sweep", tmp_path / "nowhere"
    spec.write_text(SPEC)
    code = main(["sweep", "launch", "--spec", str(spec), "--output_dir", str(out), "--data_dir", str(missing),
                 "--yes", "--launcher", "local"])
    captured = capsys.readouterr()
    assert code == 2 and captured.err.strip() == (
        f"domaingen: error: data directory {missing} (--data_dir) does not exist and ColoredMNIST needs it: give "
        "--data_dir or $DOMAINGEN_DATA the directory holding the data (`domaingen download` fills one), or, for "
        "MNIST datasets, --data_dir embedded")
    assert not out.exists() and not missing.exists()
    monkeypatch.chdir(tmp_path)  # no ./data here: the default is named as such
    assert main(["sweep", "launch", "--spec", str(spec), "--output_dir", str(out), "--yes"]) == 2
    assert "data directory ./data (the default) does not exist" in capsys.readouterr().err


def test_a_dataset_built_in_memory_needs_no_data_directory(tmp_path):
    from domaingen.datasets import check_data_dir

    check_data_dir(str(tmp_path / "nowhere"), ["FeatureContamination"])  # returns: it reads no files
    check_data_dir("embedded", ["ColoredMNIST"])
    check_data_dir(str(tmp_path), ["ColoredMNIST"])


@pytest.mark.fast
def test_status_of_a_directory_holding_no_sweep_says_so(tmp_path, capsys):
    code = main(["sweep", "status", "--output_dir", str(tmp_path)])
    assert code == 2 and capsys.readouterr().err.strip() == (
        f"domaingen: error: {tmp_path} holds no sweep (no sweep.json there): give the directory a sweep was "
        "launched into, or --spec FILE to count that spec's jobs there")
