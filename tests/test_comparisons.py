"""collect --paired and --fields: differences by restart and record fields at the selected checkpoint."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from domaingen.cli.main import main
from domaingen.tables.collect import Collection
from domaingen.tables.comparisons import (argument_differences, default_pairs, field_tables, paired_tables, parse_pairs,
                                   versus_tables)
from domaingen.errors import DomaingenError
from domaingen.tables.reporting import Cell, build_tables, to_csv, to_markdown
from domaingen.run.rundir import to_json
from test_selection import rec

# test accuracy (env 0's in split) per trial at the last step, which training-domain validation picks
# (the out accuracies of envs 1, 2 rise with the step); trial 2 of ERM+ModReg does not exist
TEST = {"ERM": [0.50, 0.60, 0.70], "ERM+ModReg": [0.55, 0.58]}
KEPT = {0: [0.9, 0.4], 1: [0.8, 0.3]}  # ERM+ModReg's kept fraction at steps 0, 1 per trial


def records(test: dict[str, list[float]] = TEST) -> pd.DataFrame:
    rows = []
    for algorithm, tests in test.items():
        for trial, test in enumerate(tests):
            for step in (0, 1):
                row = rec(algorithm, [0], 0, trial, step, [test if step else 0.1, .9, .9], [.5, .6 + step / 10, .6 + step / 10],
                          dataset="ColoredMNIST")
                if algorithm == "ERM+ModReg":
                    row["modreg_kept_fraction"] = KEPT[trial][step]
                    row["modreg_layer0_kept_fraction"] = KEPT[trial][step] / 2
                rows.append(row)
    return pd.DataFrame(rows)


@pytest.fixture
def collection() -> Collection:
    return Collection(records())


def test_paired_differences_match_by_trial_seed(collection):
    tables = build_tables(collection, ["training"])
    [paired] = paired_tables(tables, parse_pairs([]))
    assert paired.columns == ["+90%"] and list(paired.rows) == ["ERM+ModReg − ERM"]
    cell = paired.rows["ERM+ModReg − ERM"][0]
    diffs = np.array([0.55 - 0.50, 0.58 - 0.60])  # trials 0 and 1; ERM's trial 2 has no partner
    assert cell.values == pytest.approx(diffs.tolist())
    assert cell.se == pytest.approx(np.std(diffs, ddof=1) / np.sqrt(2))
    assert cell.note == "lower in 1 of 2 trials, higher in 1; 1 unpaired trial(s) left out"
    assert [t["trial_seed"] for t in cell.trace] == [0, 1]
    md = to_markdown(tables + [paired], collection, error="se")
    # two pairs: the paired t-test (one test in the table, so Holm leaves its p)
    t = diffs.mean() / (np.std(diffs, ddof=1) / np.sqrt(2))
    p = 2 * stats.t.sf(abs(t), 1)
    assert cell.test == "t" and cell.p_value == pytest.approx(p) and cell.p_holm == pytest.approx(p)
    assert (f"| ERM+ModReg − ERM | {100 * diffs.mean():.1f} ± {100 * np.std(diffs, ddof=1) / np.sqrt(2):.1f}"
            f", p={p:.2g} (t) |") in md
    assert "Holm-adjusted over the table's 1 test (W: Wilcoxon signed-rank" in paired.title


def test_named_pairs_and_their_errors(collection):
    tables = build_tables(collection, ["training"])
    [paired] = paired_tables(tables, parse_pairs(["ERM:ERM+ModReg"]))
    assert paired.rows["ERM − ERM+ModReg"][0].values == pytest.approx([-0.05, 0.02])
    assert default_pairs(["ERM", "IRM+ModReg", "ERM+ModReg"]) == [("ERM+ModReg", "ERM")]
    with pytest.raises(DomaingenError, match="--paired takes ALGORITHM:BASE pairs"):
        parse_pairs(["ERM-ERM+ModReg"])
    with pytest.raises(DomaingenError, match="--paired names IRM, which no table has"):
        paired_tables(tables, [("IRM", "ERM")])
    only_erm = Collection(records().query("algorithm == 'ERM'"))
    with pytest.raises(DomaingenError, match="no composed algorithm X\\+Y beside its base X"):
        paired_tables(build_tables(only_erm, ["training"]), [])


def test_fields_are_read_at_the_selected_checkpoint(collection):
    tables = build_tables(collection, ["training"])
    [fields] = field_tables(tables, collection.records, ["modreg_*kept_fraction"])
    assert fields.columns == ["modreg_kept_fraction", "modreg_layer0_kept_fraction"]
    assert list(fields.rows) == ["ERM+ModReg"]  # ERM records no such field
    whole, layer0 = fields.rows["ERM+ModReg"]
    assert whole.values == pytest.approx([0.4, 0.3])  # step 1, the selected one, of trials 0 and 1
    assert layer0.values == pytest.approx([0.2, 0.15])
    assert whole.text(error="se") == f"{0.35:.3g} ± {np.std([0.4, 0.3], ddof=1) / np.sqrt(2):.2g}"  # not x100
    csv = pd.read_csv(io.StringIO(to_csv([fields])))
    assert csv["table"].tolist() == ["fields", "fields"] and csv["mean"].tolist() == pytest.approx([0.35, 0.175])
    assert csv["values"].iloc[0] == "0.4;0.3"
    with pytest.raises(DomaingenError, match="no recorded field matches nothing_like_this"):
        field_tables(tables, collection.records, ["nothing_like_this"])
    # each glob must match: a misspelt one beside a good one is named, not dropped
    with pytest.raises(DomaingenError, match="no recorded field matches kept_fraction "):
        field_tables(tables, collection.records, ["modreg_kept_fraction", "kept_fraction"])


def test_the_selected_step_is_a_field():
    late = records()  # training-domain validation picks step 1 (the validation accuracies rise)
    early = records()
    early.loc[early["step"] == 0, ["env1_out_acc", "env2_out_acc"]] = 0.99  # now it picks step 0
    for recs, step, kept in [(late, 1, {0: 0.4, 1: 0.3}), (early, 0, {0: 0.9, 1: 0.8})]:
        collection = Collection(recs)
        [fields] = field_tables(build_tables(collection, ["training"]), collection.records,
                                ["step", "modreg_kept_fraction"])
        assert fields.columns == ["step", "modreg_kept_fraction"]
        assert list(fields.rows) == ["ERM", "ERM+ModReg"]  # every run has a step, only ModReg's a mask
        assert fields.rows["ERM"][0].values == [step] * 3 and fields.rows["ERM"][1].missing
        assert fields.rows["ERM+ModReg"][0].values == [step] * 2
        assert fields.rows["ERM+ModReg"][1].values == pytest.approx([kept[0], kept[1]])


def test_large_fields_print_as_whole_numbers():
    steps = [4300.0, 4400.0, 3900.0]
    se = np.std(steps, ddof=1) / np.sqrt(3)  # 152.75...
    assert Cell(steps, percent=False).text(error="se") == f"4200 ± {round(se)}"
    assert Cell([5000.0] * 24, percent=False).text(error="se") == "5000 ± 0"  # not ± 1.1e-13, float noise
    assert Cell([0.35, 0.3], percent=False).text(error="se").startswith("0.325 ± ")
    assert Cell([2.5e6], percent=False).text() == "2.5e+06"
    kept = [1.0, 1.0, 0.9999999999999999] * 4  # their standard error is 5.6e-17: float noise, printed as 0
    assert 0 < np.std(kept) < 1e-15 and Cell(kept, percent=False).text(error="se") == "1 ± 0"


def write_sweep(root, test: dict[str, list[float]] = TEST, **extra_args):
    for (algorithm, trial, test_envs), sub in records(test).groupby(["algorithm", "trial_seed", "test_envs"]):
        run = root / f"{algorithm}_{trial}"
        run.mkdir(parents=True)
        args = {"dataset": "ColoredMNIST", "algorithm": algorithm, "test_envs": list(test_envs), "hparams_seed": 0,
                "trial_seed": int(trial), "output_dir": str(run), **extra_args}
        lines = [to_json({**{k: v for k, v in r.items() if k.startswith(("env", "modreg")) or k == "step"},
                          "args": args, "hparams": {}, "data_source": "MNIST-70000"}) for r in sub.to_dict("records")]
        (run / "results.jsonl").write_text("\n".join(lines) + "\n")
        (run / "args.json").write_text(json.dumps(args))
        (run / "done").write_text("{}")


def test_collect_command_adds_the_tables(tmp_path, capsys):
    write_sweep(tmp_path / "s")
    assert main(["-q", "collect", "--input_dir", str(tmp_path / "s"), "--selection", "training", "--paired",
                 "--fields", "modreg_kept_fraction", "--format", "csv"]) == 0
    csv = pd.read_csv(io.StringIO(capsys.readouterr().out))
    paired = csv[csv["table"] == "paired"].iloc[0]
    assert paired["algorithm"] == "ERM+ModReg − ERM" and paired["mean"] == pytest.approx(0.015)
    assert paired["runs"] == "ERM+ModReg_0-ERM_0;ERM+ModReg_1-ERM_1"
    assert csv[csv["table"] == "fields"]["mean"].tolist() == pytest.approx([0.35])


def test_collect_refuses_bad_pairs_in_one_line(tmp_path, capsys):
    write_sweep(tmp_path / "s")
    assert main(["collect", "--input_dir", str(tmp_path / "s"), "--paired", "ERM"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("--paired takes ALGORITHM:BASE pairs (e.g. ERM+ModReg:ERM), got 'ERM'")
    # top-hparams prints no tables to add to
    assert main(["collect", "top-hparams", "--input_dir", str(tmp_path / "s"), "--paired"]) == 2
    assert capsys.readouterr().err.strip().startswith("domaingen collect top-hparams: error: unknown flag --paired")


# a twin sweep: the same restarts with one setting changed; ERM has trials 0-2 in both
TEST_B = {"ERM": [0.52, 0.57, 0.75], "IRM": [0.3]}


def test_versus_pairs_two_sweeps_by_trial_seed():
    a, b = Collection(records()), Collection(records(TEST_B))
    [table] = versus_tables(build_tables(a, ["training"]), build_tables(b, ["training"]), "bf16", "fp32")
    assert table.key == "ColoredMNIST/training/versus" and table.columns == ["+90%"]
    # only ERM is in both; ERM+ModReg (A only) and IRM (B only) are left out
    assert list(table.rows) == ["ERM (bf16)", "ERM (fp32)", "ERM: bf16 − fp32"]
    assert table.rows["ERM (bf16)"][0].values == pytest.approx(TEST["ERM"])
    assert table.rows["ERM (fp32)"][0].values == pytest.approx(TEST_B["ERM"])
    diffs = np.array(TEST["ERM"]) - np.array(TEST_B["ERM"])
    cell = table.rows["ERM: bf16 − fp32"][0]
    assert cell.values == pytest.approx(diffs.tolist())
    assert cell.se == pytest.approx(np.std(diffs, ddof=1) / np.sqrt(3))
    assert cell.note == "lower in 2 of 3 trials, higher in 1"
    assert "bf16 against fp32 (differences paired by trial_seed)" in table.title
    with pytest.raises(DomaingenError, match="^bf16 and fp32 have no algorithm and held-out environment in common$"):
        versus_tables(build_tables(a, ["training"]), build_tables(Collection(records({"IRM": [0.3]})), ["training"]),
                      "bf16", "fp32")
    other = Collection(records().assign(dataset="RotatedMNIST"))
    with pytest.raises(DomaingenError, match="^bf16 and fp32 share no dataset to compare "
                                             "\\(bf16: ColoredMNIST; fp32: RotatedMNIST\\)$"):
        versus_tables(build_tables(a, ["training"]), build_tables(other, ["training"]), "bf16", "fp32")


def test_argument_differences_name_what_the_twins_differ_in():
    run = {"dataset": "ColoredMNIST", "algorithm": "ERM", "test_envs": [2], "hparams_seed": 0, "trial_seed": 1,
           "steps": 5001, "output_dir": "a/x"}
    twin = {**run, "output_dir": "b/x"}
    assert argument_differences([run], [twin], "A", "B") == (
        "1 run of A has a twin in B (same dataset, algorithm, test_envs, hparams_seed, trial_seed); their "
        "arguments are identical, so the differences measure run-to-run nondeterminism")
    assert argument_differences([{**run, "precision": "bf16"}], [{**twin, "precision": "fp32"}], "A", "B") == (
        "1 run of A has a twin in B (same dataset, algorithm, test_envs, hparams_seed, trial_seed); their "
        'arguments differ in precision ("bf16" in A, "fp32" in B)')
    assert argument_differences([run], [{**twin, "trial_seed": 2}], "A", "B").startswith("no run of A has a twin in B")


def test_collect_versus_command(tmp_path, capsys):
    write_sweep(tmp_path / "bf16", precision="bf16")
    write_sweep(tmp_path / "fp32", TEST_B, precision="fp32")
    assert main(["-q", "collect", "versus", "--input_dir", str(tmp_path / "bf16"), "--other", str(tmp_path / "fp32"),
                 "--selection", "training", "--error", "se"]) == 0
    out = capsys.readouterr().out
    diffs = np.array(TEST["ERM"]) - np.array(TEST_B["ERM"])
    assert out.startswith("3 runs of bf16 have a twin in fp32 (same dataset, algorithm, test_envs, hparams_seed, "
                          'trial_seed); their arguments differ in precision ("bf16" in bf16, "fp32" in fp32); '
                          "fp32 has 4 done runs")
    se = np.std(diffs, ddof=1) / np.sqrt(3)
    assert f"| ERM: bf16 − fp32 | {100 * diffs.mean():.1f} ± {100 * se:.1f} |" in out.replace("  ", "")


def test_collect_versus_refuses_bad_input_in_one_line(tmp_path, capsys):
    write_sweep(tmp_path / "s")
    for other, message in [
        (tmp_path / "s", f"--other {tmp_path / 's'} is the --input_dir itself; name another sweep directory"),
        (tmp_path / "none", f"--other {tmp_path / 'none'}: no such directory; name a sweep directory to compare "
                            "with"),
    ]:
        assert main(["collect", "versus", "--input_dir", str(tmp_path / "s"), "--other", str(other)]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"domaingen: error: {message}"
    for extra in (["--fields", "x"], ["--paired"]):  # versus prints its own tables: nothing to add to
        assert main(["collect", "versus", "--input_dir", str(tmp_path / "s"), "--other", str(tmp_path / "none"),
                     *extra]) == 2
        assert capsys.readouterr().err.strip().startswith(f"domaingen collect versus: error: unknown flag {extra[0]}")
