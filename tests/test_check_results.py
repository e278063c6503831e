"""domaingen check-results: committed files reprinted from records bundles, and each way it can fail in one line."""

from __future__ import annotations

import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

from domaingen.cli import main
from domaingen.tables.regenerate import bundles_named, first_difference

SPEC = """
algorithms = ["ERM"]
datasets = ["ColoredMNIST"]
n_hparams = 2
n_trials = 1
steps = 3
checkpoint_freq = 2

[hparams]
featurizer = "MLP"
mlp_width = 16
batch_size = 16
"""

COLLECT = "domaingen -q collect --input_dir results/records/erm.zip --selection training"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A repository root with results/erm.md, its records bundle and regenerate.tsv."""
    root = tmp_path_factory.mktemp("repo")
    (root / "spec.toml").write_text(SPEC)
    assert main(["-q", "sweep", "launch", "--spec", str(root / "spec.toml"), "--output_dir", str(root / "sweep"),
                 "--data_dir", "embedded", "--launcher", "local", "--no_progress", "--yes"]) == 0
    (root / "results" / "records").mkdir(parents=True)
    assert main(["-q", "export", "--input_dir", str(root / "sweep"), "--output", str(root / "results/records/erm.zip"),
                 "--no_weights", "--all_runs", "--backs", "results/erm.md"]) == 0
    shutil.rmtree(root / "sweep")
    return root


def checked_copy(repo: Path, tmp_path: Path, capsys, table: str | None = None, tsv: str | None = None) -> Path:
    """A copy of `repo` whose results/erm.md is what the command prints (or `table`)."""
    root = tmp_path / "root"
    shutil.copytree(repo, root)
    if table is None:
        code, table, _ = run(capsys, "collect", "--input_dir", str(root / "results/records/erm.zip"),
                             "--selection", "training")
        assert code == 0
    (root / "results" / "erm.md").write_text(table)
    (root / "results" / "regenerate.tsv").write_text(tsv if tsv is not None else f"results/erm.md\t{COLLECT}\n")
    return root


def check(capsys, root: Path) -> tuple[int, str]:
    code, out, _ = run(capsys, "check-results", "--root", str(root))
    return code, out


def test_a_table_reprinted_from_its_bundle_passes(repo, tmp_path, capsys):
    root = checked_copy(repo, tmp_path, capsys)
    code, out = check(capsys, root)
    assert code == 0, out
    assert out.splitlines() == ["ok   results/erm.md",
                                "check-results: all 1 files of results/regenerate.tsv regenerate from their records"]


def test_the_bundle_backs_what_export_was_told_and_holds_every_run_without_weights(repo):
    with zipfile.ZipFile(repo / "results/records/erm.zip") as zf:
        assert not [n for n in zf.namelist() if n.endswith(".pt")]
        info = json.loads(zf.read("erm/bundle.json"))
        with tarfile.open(fileobj=zf.open("erm/records.tar.xz"), mode="r|xz") as tar:
            names = [f"erm/{m.name}" for m in tar]
    assert info["backs"] == ["results/erm.md"] and info["all_runs"] is True
    assert len({n.split("/")[2] for n in names if "/runs/" in n}) == 6  # 3 test environments x 2 draws
    assert sum(n.endswith("/manifest.json") for n in names) == 6


def test_an_edited_table_is_named_with_its_first_differing_line(repo, tmp_path, capsys):
    root = checked_copy(repo, tmp_path, capsys)
    lines = (root / "results/erm.md").read_text().splitlines(keepends=True)
    number = next(i for i, line in enumerate(lines) if "|" in line and any(c.isdigit() for c in line))
    original = lines[number]
    lines[number] = original.replace("|", "| 99.9 ", 1)
    (root / "results/erm.md").write_text("".join(lines))
    code, out = check(capsys, root)
    assert code == 1
    problem = (f"results/erm.md: line {number + 1} differs: the file has {lines[number].rstrip(chr(10))[:80]!r}, "
               f"the command printed {original.rstrip(chr(10))[:80]!r}")
    assert out.splitlines()[0] == f"FAIL {problem}"
    assert out.splitlines()[-1] == problem


def test_first_difference_names_extra_and_missing_lines():
    assert first_difference("a\nb\n", "a\nc\n") == "line 2 differs: the file has 'b', the command printed 'c'"
    assert first_difference("a\nb\n", "a\n") == "line 2: the command printed nothing more, the file has 'b'"
    assert first_difference("a\n", "a\nb\n") == "line 2: the file ends, the command printed 'b'"


def test_bundles_named_reads_the_zip_arguments_of_a_shell_command():
    assert bundles_named("domaingen collect --input_dir results/records/a.zip --other 'results/records/b c.zip'"
                         " && echo x.zip 'A, b=y.zip'") == ["results/records/a.zip", "results/records/b c.zip", "x.zip",
                                                             "y.zip"]


def one_problem(capsys, root: Path) -> str:
    code, out = check(capsys, root)
    assert code == 1
    fails = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert len(fails) <= 1
    return out.splitlines()[-1]


def test_a_missing_bundle_names_it(repo, tmp_path, capsys):
    root = checked_copy(repo, tmp_path, capsys)
    (root / "results/records/erm.zip").unlink()
    assert one_problem(capsys, root) == "results/erm.md: its records bundle results/records/erm.zip is missing"


def test_a_damaged_bundle_names_it(repo, tmp_path, capsys):
    root = checked_copy(repo, tmp_path, capsys)
    (root / "results/records/erm.zip").write_bytes(b"not a zip")
    assert one_problem(capsys, root) == (
        "results/erm.md: results/records/erm.zip is not a usable domaingen bundle (not a zip file: File is not a zip "
        "file); export it again with domaingen export")


def test_a_bundle_that_backs_another_table_is_refused(repo, tmp_path, capsys):
    root = checked_copy(repo, tmp_path, capsys)
    shutil.copy(root / "results/erm.md", root / "results/other.md")
    (root / "results/regenerate.tsv").write_text(f"results/erm.md\t{COLLECT}\nresults/other.md\t{COLLECT}\n")
    assert one_problem(capsys, root) == ("results/other.md: results/records/erm.zip backs results/erm.md, not "
                                         "results/other.md (export it with --backs results/other.md)")


def test_a_line_naming_a_missing_file_and_a_file_without_a_line(repo, tmp_path, capsys):
    root = checked_copy(repo, tmp_path, capsys,
                        tsv=f"results/erm.md\t{COLLECT}\nresults/gone.md\tmeasured: by hand\n")
    assert one_problem(capsys, root) == "results/regenerate.tsv line 2: results/gone.md does not exist"
    root = checked_copy(repo, tmp_path / "b", capsys)
    (root / "results/new.csv").write_text("a,b\n")
    assert one_problem(capsys, root) == "results/new.csv: no line in results/regenerate.tsv"


def test_a_measured_line_is_listed_not_regenerated(repo, tmp_path, capsys):
    root = checked_copy(repo, tmp_path, capsys, tsv=f"results/erm.md\t{COLLECT}\n"
                                                    "results/bench.md\tmeasured: timings on 2 vCPUs\n")
    (root / "results/bench.md").write_text("| step | 5 ms |\n")
    code, out = check(capsys, root)
    assert code == 0 and "ok   results/bench.md  (measured, not regenerated)" in out


def test_a_failing_command_and_a_malformed_line(repo, tmp_path, capsys):
    root = checked_copy(repo, tmp_path, capsys, tsv="results/erm.md\tdomaingen collect --input_dir nowhere\n")
    assert one_problem(capsys, root).startswith("results/erm.md: the command failed (exit 2): domaingen: error: ")
    (root / "results/regenerate.tsv").write_text("results/erm.md domaingen collect\n")
    code, _, err = run(capsys, "check-results", "--root", str(root))
    assert code == 2 and err.strip() == ("domaingen: error: results/regenerate.tsv line 1: expected "
                                         "PATH<TAB>COMMAND, got 'results/erm.md domaingen collect'")


def test_write_rewrites_a_file_that_differs_from_its_command(repo, tmp_path, capsys):
    root = checked_copy(repo, tmp_path, capsys)
    good = (root / "results/erm.md").read_text()
    (root / "results/erm.md").write_text("stale\n")
    code, _, _ = run(capsys, "check-results", "--root", str(root), "--write")
    assert code == 0 and (root / "results/erm.md").read_text() == good


def test_a_bundle_of_all_runs_tabulates_any_selection_method(repo, capsys):
    code, text, _ = run(capsys, "collect", "--input_dir", str(repo / "results/records/erm.zip"), "--selection", "last")
    assert code == 0 and "no selection: final checkpoint" in text
