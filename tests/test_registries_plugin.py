"""A plugin registers a selection method and a launcher; the CLI launches, lists, collects and exports with them."""

from __future__ import annotations

import io
import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import FAST_HPARAMS
from domaingen import plugins
from domaingen.cli.main import main
from domaingen.registry import NameClashError, UnknownNameError
from domaingen.sweep.launch import LAUNCHERS, check_options, launch, register_launcher
from domaingen.sweep.spec import build_jobs, parse_spec, read_recorded_spec
from domaingen.sweep.workers import LaunchOptions
from domaingen.tables.selection import SELECTION_METHODS, register_selection_method, select

PLUGIN = """
    from domaingen.sweep.launch import register_launcher
    from domaingen.sweep.workers import job_kwargs, run_job
    from domaingen.tables.selection import register_selection_method, scored_checkpoints

    RAN = []  # the job ids the launcher ran, in its order


    @register_selection_method("first", "first checkpoint of each run", default=True)
    def first_checkpoint(records):
        scored = scored_checkpoints(records)
        return scored.sort_values("step", kind="stable").drop_duplicates("run", keep="first")


    @register_launcher("reverse", "in this process, the last job first")
    def launch_reverse(jobs, sweep_dir, data_dir, options):
        results = []
        for job in reversed(list(jobs)):
            RAN.append(job.job_id)
            results.append(run_job(job.job_id, job_kwargs(job, sweep_dir, data_dir, options.loggers), 1))
        return results
"""
# a second plugin that takes a name the first one registered
CLASH = """
    from domaingen.tables.selection import register_selection_method

    @register_selection_method("first", "the first checkpoint, again")
    def first_again(records):
        return records
"""
BUILT_IN_LAUNCHERS = "local, parallel, slurm, ray, dry"
BUILT_IN_SELECTIONS = "training, loo, oracle, last"


@pytest.fixture
def write_plugin(tmp_path, monkeypatch):
    """Write plugin modules into tmp_path; what they register and load is undone afterwards."""
    monkeypatch.chdir(tmp_path)
    tables = (SELECTION_METHODS, LAUNCHERS)
    before = {table.kind: set(table.names()) for table in tables}
    loaded_before = set(plugins.loaded_plugins())
    written: list[str] = []

    def write(name: str, body: str) -> Path:
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(body))
        written.append(name)
        return path

    yield write
    for table in tables:
        for name in set(table.names()) - before[table.kind]:
            table.unregister(name)
    for spec in set(plugins.loaded_plugins()) - loaded_before:
        plugins.forget(spec)
    for name in written:
        plugins.forget(name)
        sys.modules.pop(name, None)


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def launch_args(out: Path, launcher: str) -> list[str]:
    return ["sweep", "launch", "--algorithms", "ERM", "--datasets", "ColoredMNIST", "--n_hparams", "1",
            "--n_trials", "2", "--steps", "3", "--checkpoint_freq", "1", "--test_envs", "2", "--eval_splits", "all",
            "--hparams", json.dumps(FAST_HPARAMS), "--output_dir", str(out), "--data_dir", "embedded",
            "--launcher", launcher, "--no_progress", "--yes"]


def first_checkpoint_cell(sweep_dir: Path) -> tuple[float, int]:
    """The test accuracy at each run's first checkpoint, averaged over runs (one draw, so over trials), from the files."""
    values = []
    for run in sorted(p for p in sweep_dir.iterdir() if (p / "done").exists()):
        records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
        first = min(records, key=lambda r: r["step"])
        values.append(first["env2_in_acc"])
    return float(np.mean(values)), len(values)


def cells(csv_text: str, selection: str) -> pd.DataFrame:
    table = pd.read_csv(io.StringIO(csv_text))
    return table[(table["selection"] == selection) & (table["table"] == "test") & (table["column"] == "-90%")]


def test_a_plugin_launcher_and_selection_method_run_a_sweep_and_tabulate(write_plugin, tmp_path, capsys):
    path = write_plugin("toy_registries", PLUGIN)
    out = tmp_path / "sweep"
    code, stdout, err = cli(capsys, "--plugins", str(path), *launch_args(out, "reverse"))
    assert code == 0 and "launched 2 jobs: 2 done" in stdout, err
    jobs = build_jobs(parse_spec(read_recorded_spec(out)))
    assert sys.modules["toy_registries"].RAN == [job.job_id for job in reversed(jobs)]

    # collect without --selection: the plugin's method is in the default set, after training and oracle
    code, text, _ = cli(capsys, "collect", "--input_dir", str(out), "--format", "csv")
    assert code == 0
    assert list(dict.fromkeys(pd.read_csv(io.StringIO(text))["selection"])) == ["training", "oracle", "first"]
    expected, runs = first_checkpoint_cell(out)
    row = cells(text, "first")
    assert runs == 2 and row["n"].iloc[0] == 2
    assert row["mean"].iloc[0] == pytest.approx(expected)
    code, markdown, _ = cli(capsys, "collect", "--input_dir", str(out))
    assert "ColoredMNIST: test accuracy, first checkpoint of each run" in markdown

    # export --selection first bundles its runs; collect reads the bundle back with that method only
    bundle = tmp_path / "first.zip"
    code, _, err = cli(capsys, "export", "--input_dir", str(out), "--output", str(bundle), "--selection", "first",
                       "--no_weights")
    assert code == 0, err
    code, text, _ = cli(capsys, "collect", "--input_dir", str(bundle), "--format", "csv")
    assert code == 0 and set(pd.read_csv(io.StringIO(text))["selection"]) == {"first"}
    assert cells(text, "first")["mean"].iloc[0] == pytest.approx(expected)

    code, listing, _ = cli(capsys, "--plugins", str(path), "list")
    rows = [line.split() for line in listing.split("Plugins loaded:", 1)[1].splitlines()]
    assert ["toy_registries", "selection", "method", "first"] in rows and ["toy_registries", "launcher", "reverse"] in rows


def test_unknown_launcher_and_selection_names_list_the_valid_ones(write_plugin, tmp_path, capsys):
    path = write_plugin("toy_registries", PLUGIN)
    assert main(["-q", "--plugins", str(path), *launch_args(tmp_path / "s", "nope")]) == 2
    err = capsys.readouterr().err.replace("'", "")
    assert err.strip().splitlines()[-1].endswith(
        f"argument --launcher: invalid choice: nope (choose from {BUILT_IN_LAUNCHERS}, reverse)")
    assert main(["-q", "export", "--input_dir", str(tmp_path), "--output", "b.zip", "--selection", "best"]) == 2
    err = capsys.readouterr().err.replace("'", "")
    assert err.strip().splitlines()[-1].endswith(
        f"argument --selection: invalid choice: best (choose from {BUILT_IN_SELECTIONS}, first)")

    plugin_hint = "(one of your own: load its module with --plugins MODULE)"
    for call in (lambda: launch([], str(tmp_path), None, "nope", LaunchOptions()),
                 lambda: check_options("nope", LaunchOptions())):
        with pytest.raises(UnknownNameError) as error:
            call()
        assert str(error.value) == f"unknown launcher 'nope'; valid launchers: {BUILT_IN_LAUNCHERS}, reverse {plugin_hint}"
    with pytest.raises(UnknownNameError) as error:
        select(pd.DataFrame(), "best")
    assert str(error.value) == (f"unknown selection method 'best'; valid selection methods: {BUILT_IN_SELECTIONS}, "
                                f"first {plugin_hint}")


def test_a_name_registered_twice_is_a_clash(write_plugin, capsys):
    write_plugin("toy_registries", PLUGIN)
    write_plugin("clash_registries", CLASH)
    code, out, err = cli(capsys, "--plugins", "toy_registries,clash_registries", "list")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.strip() == ("domaingen: error: plugin clash_registries failed to import: NameClashError: selection "
                           "method 'first' is registered twice: by toy_registries and by clash_registries; rename one "
                           "of them")

    def run_nothing(jobs, sweep_dir, data_dir, options):
        return []

    with pytest.raises(NameClashError, match="launcher 'local' is registered twice: by domaingen.sweep.local "
                                             r"\(built in\) and by "):
        register_launcher("local", "runs nothing")(run_nothing)
    with pytest.raises(NameClashError, match="selection method 'training' is registered twice: by "
                                             r"domaingen.tables.selection \(built in\) and by "):
        register_selection_method("training", "selects nothing")(lambda records: records)
    assert LAUNCHERS.get("local").run is not run_nothing and SELECTION_METHODS.owners()["training"].endswith("(built in)")


def test_collects_default_methods_and_help_come_from_the_registry(write_plugin):
    from domaingen.tables.selection import default_selection_methods, selection_methods_help

    assert default_selection_methods(has_pairs=False) == ["training", "oracle"]
    assert default_selection_methods(has_pairs=True) == ["training", "oracle", "loo"]
    assert selection_methods_help().endswith("default: training and oracle, then loo when pair runs exist")
    register_selection_method("paired_first", "first checkpoint, validated on pair runs", pairs=True,
                              default=True)(lambda records: records)
    register_selection_method("single_first", "first checkpoint", default=True)(lambda records: records)
    assert default_selection_methods(has_pairs=False) == ["training", "oracle", "single_first"]
    assert default_selection_methods(has_pairs=True) == ["training", "oracle", "single_first", "loo", "paired_first"]
    assert "paired_first: first checkpoint, validated on pair runs (needs pair runs)" in selection_methods_help()
