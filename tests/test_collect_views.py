"""`domaingen collect VIEW`: each view prints what its library function renders, takes only its own
options, and the flags that used to pick a view stop with one line naming the command that replaced them."""

from __future__ import annotations

import argparse
import io
import json
import shlex
import shutil
from pathlib import Path

import pandas as pd
import pytest

from domaingen.cli.collect_commands import VIEWS, with_view
from domaingen.cli.main import main
from domaingen.cli.sweep_commands import _versus_text
from domaingen.inspect.masks_over_trials import masks_matrix_tables, matrix_text
from domaingen.tables.collect import collect
from domaingen.tables.provenance import manifest_summary
from domaingen.tables.reporting import build_tables, to_csv, to_latex, to_markdown
from domaingen.tables.top_hparams import top_hparams_csv, top_hparams_markdown
from domaingen.tables.views import draws_table, render, trajectories
from test_comparisons import TEST_B, write_sweep

DEFAULT_METHODS = ["training", "oracle"]  # collect's default for single-environment runs
# one matrix per ERM+ModReg run, at step 1 (the step training-domain validation selects in write_sweep's runs)
MATRICES = {0: [[0.9, 0.5], [0.7, 0.6]], 1: [[0.8, 0.4], [0.5, 0.7]]}


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict[str, str]:
    """test_comparisons' sweep (ERM, ERM+ModReg; the ModReg runs with a mask-by-domain matrix) and its twin."""
    root = tmp_path_factory.mktemp("views")
    write_sweep(root / "bf16", precision="bf16")
    write_sweep(root / "fp32", TEST_B, precision="fp32")
    for trial, accuracy in MATRICES.items():
        matrix = {"rows": ["+80%", "-90%"], "columns": ["+90%", "+80%"], "splits": ["in", "out"], "train_rows": 1,
                  "accuracy": accuracy, "step": 1, "test_envs": [0]}
        (root / "bf16" / f"ERM+ModReg_{trial}" / "diagnostics.json").write_text(json.dumps({"masks_x_domains": matrix}))
    return {"sweep": str(root / "bf16"), "twin": str(root / "fp32")}


def stdout_of(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert main(["-q", "collect", *argv]) == 0
    return capsys.readouterr().out


def refused(capsys, *argv: str) -> str:
    """The last stderr line of a command argparse (or a moved flag) refuses with exit status 2."""
    capsys.readouterr()
    assert main(["collect", *argv]) == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_the_tables_are_the_default_view_and_print_what_reporting_renders(sweeps, capsys):
    sweep = sweeps["sweep"]
    tables = build_tables(collect(sweep), DEFAULT_METHODS)
    markdown = stdout_of(capsys, "--input_dir", sweep)
    # a sweep without pair runs: the default tables say what they leave out and how to get it
    assert markdown == to_markdown(tables, collect(sweep)) + (
        "\nNot shown: leave-one-domain-out cross-validation (loo), which needs pair runs; this sweep has none (add "
        "`pairs = true` to the spec, or relaunch with `sweep launch --pairs`).\n") and "| ERM " in markdown
    assert "Not shown" not in stdout_of(capsys, "--input_dir", sweep, "--selection", "training", "oracle")
    assert stdout_of(capsys, "tables", "--input_dir", sweep) == markdown
    assert stdout_of(capsys, "--input_dir", sweep, "--format", "latex", "--bare", "--show_trials") == to_latex(
        tables, collect(sweep), show_n=True, bare=True)
    assert stdout_of(capsys, "tables", "--input_dir", sweep, "--format", "csv", "--error", "se") == to_csv(tables, "se")
    long = stdout_of(capsys, "--input_dir", sweep, "--format", "latex", "--long_captions")
    assert long == to_latex(tables, collect(sweep), long_captions=True)
    assert long != to_latex(tables, collect(sweep))


def test_each_view_prints_what_its_function_renders(sweeps, capsys):
    sweep, twin = sweeps["sweep"], sweeps["twin"]
    collection = collect(sweep)
    records = collection.records
    assert stdout_of(capsys, "top-hparams", "--input_dir", sweep) == top_hparams_markdown(collection, DEFAULT_METHODS)
    assert stdout_of(capsys, "top-hparams", "--input_dir", sweep, "--format", "csv", "--selection", "oracle") == (
        top_hparams_csv(collection, ["oracle"]))
    for fmt in ("markdown", "csv"):
        assert stdout_of(capsys, "trajectories", "--input_dir", sweep, "--fields", "modreg_*", "--format", fmt) == (
            render(trajectories(records, ["modreg_*"]), "mean over runs at each checkpoint", fmt))
        assert stdout_of(capsys, "draws", "--input_dir", sweep, "--format", fmt) == render(
            draws_table(records), "every hparams draw, training-domain validation (accuracies in %)", fmt)
        assert stdout_of(capsys, "manifest", "--input_dir", sweep, "--format", fmt) == manifest_summary(collection, fmt)
        assert stdout_of(capsys, "masks-x-domains", "--input_dir", sweep, "--format", fmt, "--error", "se") == (
            matrix_text(masks_matrix_tables(collection, sweep), fmt, "se"))
    assert stdout_of(capsys, "draws", "--input_dir", sweep, "--fields", "modreg_kept_fraction") == render(
        draws_table(records, ["modreg_kept_fraction"]),
        "every hparams draw, training-domain validation (accuracies in %)", "markdown")
    ns = argparse.Namespace(input_dir=sweep, other=twin, format="markdown", show_trials=False, bare=False,
                            error="se", hparams_choice="per_trial", allow_mixed_sources=False)
    versus = stdout_of(capsys, "versus", "--input_dir", sweep, "--other", twin, "--selection", "training",
                       "--error", "se")
    assert versus == _versus_text(collection, ["training"], ns)
    assert versus.startswith("3 runs of bf16 have a twin in fp32")


def test_the_mask_matrices_view_averages_the_matrices(sweeps, capsys):
    out = stdout_of(capsys, "masks-x-domains", "--input_dir", sweeps["sweep"], "--format", "csv")
    table = pd.read_csv(io.StringIO(out))
    expected = [100 * (MATRICES[0][i][j] + MATRICES[1][i][j]) / 2 for i in range(2) for j in range(2)]
    assert set(table["algorithm"]) == {"ERM+ModReg"} and table["mean"].tolist() == pytest.approx(expected)


# the flags that used to pick a view, and the one line each now stops with
MOVED = {
    "--top_hparams": "domaingen collect top-hparams --input_dir DIR",
    "--trajectories": "domaingen collect trajectories --input_dir DIR --fields GLOB ...",
    "--draws": "domaingen collect draws --input_dir DIR",
    "--versus": "domaingen collect versus --input_dir DIR --other DIR",
    "--masks_x_domains": "domaingen collect masks-x-domains --input_dir DIR",
    "--manifest": "domaingen collect manifest --input_dir DIR",
}


@pytest.mark.parametrize("flag", list(MOVED))
def test_an_old_view_flag_names_its_command_in_one_line_and_that_command_runs(flag, sweeps, capsys):
    sweep = sweeps["sweep"]
    value = {"--trajectories": ["modreg_*"], "--versus": [sweeps["twin"]]}.get(flag, [])
    for argv in (["--input_dir", sweep, flag, *value], [flag, *value, "--input_dir", sweep, "--paired"],
                 ["--input_dir", sweep, "--fields", "x", flag, *value, "--format", "latex"]):
        capsys.readouterr()
        assert main(["-q", "collect", *argv]) == 2
        assert capsys.readouterr().err == f"domaingen: error: {flag} is now '{MOVED[flag]}'\n"
    # the command it names, with DIR and GLOB filled in, prints that view
    words = shlex.split(MOVED[flag])[2:]
    filled = {"--input_dir": sweep, "--other": sweeps["twin"], "--fields": "modreg_*"}
    argv = [filled.get(words[i - 1], word) for i, word in enumerate(words) if word != "..."]
    assert stdout_of(capsys, *argv)


def _options(view: str) -> dict[str, bool]:
    """A view's option -> whether it takes a value."""
    parser = argparse.ArgumentParser()
    VIEWS[view].add_arguments(parser)
    return {a.option_strings[0]: a.nargs != 0 for a in parser._actions if a.option_strings[0] != "-h"}


# the views of a sweep's runs; mask-transfer reads the record files of `domaingen mask-transfer` (--records)
RUN_VIEWS = [view for view in VIEWS if view != "mask-transfer"]


@pytest.mark.parametrize("view", RUN_VIEWS)
def test_a_view_refuses_the_options_of_the_others(view, sweeps, capsys):
    own = _options(view)
    foreign = {o: takes for v in VIEWS for o, takes in _options(v).items() if o not in own}
    assert foreign  # every view lacks some other view's option
    needed = {"trajectories": ["--fields", "x"], "versus": ["--other", "x"],
              "correlations": ["--fields", "x", "--against", "y"]}.get(view, [])
    for option, takes_value in foreign.items():
        given = [option] + (["x"] if takes_value else [])
        message = refused(capsys, view, "--input_dir", sweeps["sweep"], *needed, *given)
        assert message.startswith(f"domaingen collect {view}: error: unknown flag {option}")


def test_views_take_their_own_options_and_refuse_formats_they_cannot_print(sweeps, capsys):
    assert set(_options("tables")) >= {"--paired", "--fields", "--reference", "--selection", "--error", "--bare"}
    assert "--fields" in _options("draws") and "--other" in _options("versus")
    for view in RUN_VIEWS:  # the options every view of runs shares
        assert set(_options(view)) >= {"--input_dir", "--format", "--output", "--datasets", "--algorithms",
                                       "--protocol", "--allow_mixed_sources"}
    for view in ("top-hparams", "trajectories", "draws", "masks-x-domains", "manifest"):
        extra = ["--fields", "x"] if view == "trajectories" else []
        assert "argument --format: invalid choice: 'latex'" in refused(
            capsys, view, "--input_dir", sweeps["sweep"], *extra, "--format", "latex")
    assert refused(capsys, "trajectories", "--input_dir", sweeps["sweep"]).endswith(
        "the following arguments are required: --fields")
    assert refused(capsys, "versus", "--input_dir", sweeps["sweep"]).endswith(
        "the following arguments are required: --other")


def test_collect_help_lists_every_view(capsys):
    assert main(["collect", "--help"]) == 0
    text = capsys.readouterr().out
    listed = [line.split()[0] for line in text.splitlines() if line.startswith("    ") and line.split()]
    assert [name for name in listed if name in VIEWS] == list(VIEWS)
    assert "`domaingen collect --input_dir DIR ...` is `domaingen collect tables --input_dir DIR ...`" in " ".join(
        text.split())
    assert main(["collect", "masks-x-domains", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: domaingen collect masks-x-domains [-h] --input_dir INPUT_DIR")


def test_with_view_names_the_tables_when_no_view_is_named():
    assert with_view(["-q", "collect", "--input_dir", "D"]) == ["-q", "collect", "tables", "--input_dir", "D"]
    assert with_view(["collect"]) == ["collect", "tables"]
    assert with_view(["collect", "draws", "--input_dir", "D"]) == ["collect", "draws", "--input_dir", "D"]
    assert with_view(["collect", "--help"]) == ["collect", "--help"]
    assert with_view(["train", "--output_dir", "collect"]) == ["train", "--output_dir", "collect"]
    assert with_view(["-q"]) == ["-q"]


def test_training_accuracy_and_collapse_are_derived_from_each_record(tmp_path):
    """train_acc is the mean in-split accuracy over the run's training environments (a loop by
    hand here), train_collapsed flags it within 5 points of chance (1/2 on ColoredMNIST)."""
    from domaingen.tables.collect import COLLAPSE_MARGIN, training_accuracy

    record = {"env0_in_acc": 0.52, "env1_in_acc": 0.54, "env2_in_acc": 0.9, "env0_out_acc": 0.1}
    expected = 0.0
    for env in (0, 1):
        expected += record[f"env{env}_in_acc"] / 2
    derived = training_accuracy(record, (2,), "ColoredMNIST")
    assert derived["train_acc"] == pytest.approx(expected)
    assert derived["train_collapsed"] == float(expected <= 0.5 + COLLAPSE_MARGIN) == 1.0
    fit = training_accuracy({"env0_in_acc": 0.2, "env1_in_acc": 0.98}, (0,), "RotatedMNIST")
    assert fit == {"train_acc": 0.98, "train_collapsed": 0.0}
    assert "train_collapsed" not in training_accuracy(record, (2,), "NoSuchDataset")
    assert training_accuracy({"env0_out_acc": 0.5}, (1,), "ColoredMNIST") == {}


def test_top_hparams_split_by_lists_the_run_behind_each_grid_points_cell(sweeps, tmp_path, capsys):
    """--split_by gives each grid point its own table, as `collect tables --split_by` gives it a row: here
    ERM+ModReg's trial 0 ran at scale 0.1 and trial 1 at 0.3, so each point's table names the one run
    whose held-out accuracy is that point's cell."""
    copy = tmp_path / "sweep"
    shutil.copytree(sweeps["sweep"], copy)
    for trial, scale in ((0, 0.1), (1, 0.3)):
        results = copy / f"ERM+ModReg_{trial}" / "results.jsonl"
        lines = [json.loads(line) for line in results.read_text().splitlines()]
        results.write_text("".join(json.dumps({**r, "hparams": {"modreg_scale": scale}}) + "\n" for r in lines))
    out = stdout_of(capsys, "top-hparams", "--input_dir", str(copy), "--format", "csv", "--selection", "training",
                    "--split_by", "modreg_scale")
    runs = pd.read_csv(io.StringIO(out)).set_index("algorithm")
    assert runs.loc["ERM+ModReg (modreg_scale=0.1)", "run"] == "ERM+ModReg_0"
    assert runs.loc["ERM+ModReg (modreg_scale=0.3)", "run"] == "ERM+ModReg_1"
    cells = pd.read_csv(io.StringIO(stdout_of(capsys, "--input_dir", str(copy), "--format", "csv", "--selection",
                                              "training", "--split_by", "modreg_scale")))
    test = cells[(cells["table"] == "test") & ~cells["column"].str.startswith("Avg")].set_index("algorithm")
    for point in ("ERM+ModReg (modreg_scale=0.1)", "ERM+ModReg (modreg_scale=0.3)"):
        assert test.loc[point, "runs"] == runs.loc[point, "run"]
        assert test.loc[point, "mean"] == pytest.approx(runs.loc[point, "test_acc"])
    assert refused(capsys, "top-hparams", "--input_dir", str(copy), "--split_by", "nothing") == (
        "domaingen: error: --split_by nothing: no run has this hyperparameter (they have: modreg_scale)")


def test_top_hparams_under_last_shows_no_validation_accuracy(sweeps, capsys):
    """`last` validates nothing: its rows leave val acc empty (not selection's 0 placeholder), and each
    row's test acc is the run's final record's held-out `in` accuracy, read here from results.jsonl."""
    out = stdout_of(capsys, "top-hparams", "--input_dir", sweeps["sweep"], "--format", "csv", "--selection", "last")
    frame = pd.read_csv(io.StringIO(out))
    assert len(frame) > 0 and frame["val_acc"].isna().all()
    for row in frame.itertuples():
        lines = (Path(sweeps["sweep"]) / row.run / "results.jsonl").read_text().splitlines()
        final = max((json.loads(line) for line in lines), key=lambda r: r["step"])
        assert row.step == final["step"]
        assert row.test_acc == pytest.approx(final[f"env{row.test_env}_in_acc"])
    markdown = stdout_of(capsys, "top-hparams", "--input_dir", sweeps["sweep"], "--selection", "last")
    first_row = next(line for line in markdown.splitlines() if line.startswith("| ") and "test env" not in line)
    assert [cell.strip() for cell in first_row.strip("|").split("|")][4] == "-"


def test_top_hparams_fields_are_the_selected_checkpoints(sweeps, capsys):
    """--fields adds, per selected run, its record's fields at the step selection chose: training-domain
    validation picks step 1 in every run of write_sweep's sweep, the last step is 1 too, so each trial's
    kept fraction is KEPT[trial][1]; ERM records none."""
    from test_comparisons import KEPT

    out = stdout_of(capsys, "top-hparams", "--input_dir", sweeps["sweep"], "--format", "csv", "--selection",
                    "training", "--fields", "modreg_kept*")
    frame = pd.read_csv(io.StringIO(out))
    modreg = frame[frame["algorithm"] == "ERM+ModReg"].sort_values("trial_seed")
    assert modreg["step"].tolist() == [1, 1]
    assert modreg["modreg_kept_fraction"].tolist() == pytest.approx([KEPT[0][1], KEPT[1][1]])
    assert frame[frame["algorithm"] == "ERM"]["modreg_kept_fraction"].isna().all()
    markdown = stdout_of(capsys, "top-hparams", "--input_dir", sweeps["sweep"], "--selection", "training",
                         "--fields", "modreg_kept*")
    assert "| modreg_kept_fraction " in markdown and f"| {KEPT[1][1]:.4g} " in markdown
    assert refused(capsys, "top-hparams", "--input_dir", sweeps["sweep"], "--fields", "nothing*").startswith(
        "domaingen: error: no recorded field matches nothing* (fields of these runs include: env0_in_acc")
