"""collect verdict: a published gain set against the method's defaults and grid points, paired by trial."""

from __future__ import annotations

import dataclasses

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from domaingen.cli.main import main
from domaingen.errors import DomaingenError
from domaingen.tables.collect import COLLAPSED, Collection, split_by_hparams
from domaingen.tables.verdict import (INCONCLUSIVE, OPEN, REFUTED, REPRODUCED, SMALLER, UNTESTABLE, Claim,
                                      default_rows, judge, read_claims, verdict_csv, verdict_markdown)
from test_selection import rec

BASE = [0.80, 0.82, 0.81, 0.83]  # ERM's held-out accuracy per trial
DEFAULTS = [0.002, -0.002, 0.0, 0.001]  # ERM+ModReg at its defaults minus ERM, per trial
STRONG = [0.03, 0.035, 0.032, 0.031]  # a grid point that gains in every trial
WEAK = [-0.02, -0.03, -0.025, -0.01]  # a grid point that loses in every trial
CLAIM = Claim("R-MNIST MLP, ERM", "RotatedMNIST", "0", ("MLP",), "ERM", "ERM+ModReg", 94.45, 95.43, "training",
              "ModReg abstract, Table 1")


def run_records(algorithm: str, tests, hparams: dict, tag: str, collapsed=None) -> list[dict]:
    rows = []
    for trial, test in enumerate(tests):
        row = rec(algorithm, [0], 0, trial, 100, [test] + [0.95] * 5, [0.5] + [0.9] * 5, dataset="RotatedMNIST")
        row["run"] = f"{tag}-{trial}"
        row["hparams"] = json.dumps(hparams, sort_keys=True)
        if collapsed is not None:
            row[COLLAPSED] = float(collapsed[trial])
        rows.append(row)
    return rows


def grid(points: dict[float, list[float]], featurizer: str = "MLP", collapsed=None) -> Collection:
    """ERM, then ERM+ModReg at each modreg_scale (1.0 = the default) with the given differences from ERM."""
    rows = run_records("ERM", BASE, {"featurizer": featurizer}, "erm")
    for scale, diffs in points.items():
        tests = [b + d for b, d in zip(BASE, diffs)]
        rows += run_records("ERM+ModReg", tests, {"featurizer": featurizer, "modreg_scale": scale}, f"m{scale}",
                            collapsed if scale != 1.0 else None)
    return split_by_hparams(Collection(pd.DataFrame(rows)), ["modreg_scale"])


def protocol_sweep(points: dict[float, list[float]], protocol: str, featurizer: str = "MLP") -> Collection:
    """ERM and ERM+ModReg at each modreg_scale (unsplit), every record of `protocol`."""
    rows = run_records("ERM", BASE, {"featurizer": featurizer}, f"{protocol}-erm")
    for scale, diffs in points.items():
        rows += run_records("ERM+ModReg", [b + d for b, d in zip(BASE, diffs)],
                            {"featurizer": featurizer, "modreg_scale": scale}, f"{protocol}-m{scale}")
    return Collection(pd.DataFrame([{**row, "protocol": protocol} for row in rows]), protocol=protocol)


def verdict_of(collection: Collection, claim: Claim = CLAIM):
    return judge(claim, collection, default_rows([claim], ["modreg_scale"]))


def test_default_rows_name_the_methods_defaults():
    assert default_rows([CLAIM], ["modreg_scale", "modreg_mask_lr"]) == {
        "ERM+ModReg": ["ERM+ModReg (modreg_scale=1.0, modreg_mask_lr=0.001)"]}
    assert default_rows([CLAIM], []) == {"ERM+ModReg": ["ERM+ModReg"]}


def test_points_are_paired_by_trial_with_a_t_interval_and_holm():
    v = verdict_of(grid({1.0: DEFAULTS, 0.1: STRONG, 0.01: WEAK}))
    by_name = {p.name: p for p in v.points}
    strong = by_name["ERM+ModReg (modreg_scale=0.1)"]
    assert strong.differences == pytest.approx(STRONG)
    d = np.array(STRONG)
    half = stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert strong.interval() == pytest.approx((d.mean() - half, d.mean() + half))
    raw = [stats.ttest_1samp(np.array(x), 0).pvalue for x in (DEFAULTS, STRONG, WEAK)]
    # Holm by hand: sorted ascending, the i-th smallest times (3 - i), kept monotone
    order = np.argsort(raw)
    adjusted, running = [0.0] * 3, 0.0
    for i, at in enumerate(order):
        running = max(running, min(1.0, (3 - i) * raw[at]))
        adjusted[at] = running
    names = ["ERM+ModReg (modreg_scale=1.0)", "ERM+ModReg (modreg_scale=0.1)", "ERM+ModReg (modreg_scale=0.01)"]
    assert [by_name[n].p_holm for n in names] == pytest.approx(adjusted)
    assert v.best is strong and v.defaults is by_name["ERM+ModReg (modreg_scale=1.0)"]
    assert v.verdict == REPRODUCED  # a gain of 3.2 points, the claim 0.98: within reach


def test_a_gain_below_the_claim_is_a_smaller_gain():
    big_claim = Claim(**{**CLAIM.__dict__, "method_mean": CLAIM.base_mean + 10})
    assert verdict_of(grid({1.0: DEFAULTS, 0.1: STRONG}), big_claim).verdict == SMALLER


def test_refuted_needs_defaults_and_a_grid_point():
    # both points lose: even the better one's interval lies below the claimed +0.98
    assert max(np.mean(DEFAULTS) + stats.t.ppf(0.975, 3) * np.std(DEFAULTS, ddof=1) / 2, 0) < 0.0098
    v = verdict_of(grid({1.0: DEFAULTS, 0.01: WEAK}))
    assert v.verdict == REFUTED and v.best.name == "ERM+ModReg (modreg_scale=1.0)"
    only_defaults = verdict_of(grid({1.0: DEFAULTS}))
    assert only_defaults.verdict == OPEN
    assert only_defaults.reason == "would be 'refuted', but no grid point beside the defaults was run"
    no_defaults = verdict_of(grid({0.01: WEAK, 0.03: WEAK}))
    assert no_defaults.verdict == OPEN and no_defaults.reason == "would be 'refuted', but the defaults were not run"


def test_a_wide_interval_is_inconclusive():
    noisy = [0.05, -0.06, 0.04, -0.05]
    assert verdict_of(grid({1.0: noisy, 0.1: noisy[::-1]})).verdict == INCONCLUSIVE


def test_claims_without_runs_are_open_and_unknown_datasets_untestable():
    v = verdict_of(grid({1.0: DEFAULTS}, featurizer="MNIST_CNN"))
    assert v.verdict == OPEN and v.reason == "no run of RotatedMNIST with featurizer MLP yet"
    irm = Claim(**{**CLAIM.__dict__, "base": "IRM", "method": "IRM+ModReg"})
    assert verdict_of(grid({1.0: DEFAULTS})).reason.startswith("would be")  # runs there: open for want of a grid
    assert judge(irm, grid({1.0: DEFAULTS})).reason == "no IRM run yet"
    unpaired = grid({1.0: DEFAULTS})
    unpaired.records.loc[unpaired.records["algorithm"] != "ERM", "trial_seed"] += 10
    assert verdict_of(unpaired).reason == "no ERM+ModReg run that shares a trial_seed with ERM yet"
    elsewhere = Claim(**{**CLAIM.__dict__, "dataset": "CelebA"})
    v = judge(elsewhere, grid({1.0: DEFAULTS}))
    assert v.verdict == UNTESTABLE and v.reason == "domaingen has no dataset CelebA"


def test_collapsed_runs_are_counted_at_the_best_point():
    v = verdict_of(grid({1.0: DEFAULTS, 0.1: STRONG}, collapsed=[1, 0, 1, 0]))
    assert v.best.collapsed == 2
    assert "2 of 4 collapsed" in verdict_markdown([v])


def test_a_checkpoint_without_training_splits_is_judged_on_its_validation_splits():
    # with --eval_splits final only the last step evaluates the in splits; the selected step 100 has its
    # training environments' out splits (the selection split), and those decide, not the last step's flag
    def sweep(selected_out: float) -> Collection:
        rows = run_records("ERM", BASE, {"featurizer": "MLP"}, "erm", collapsed=[0] * 4)
        for trial, diff in enumerate(STRONG):
            selected = rec("ERM+ModReg", [0], 0, trial, 100, [BASE[trial] + diff] + [math.nan] * 5,
                           [0.5] + [selected_out] * 5, dataset="RotatedMNIST")
            last = rec("ERM+ModReg", [0], 0, trial, 200, [0.1] * 6, [0.5] + [selected_out / 2] * 5,
                       dataset="RotatedMNIST")  # at chance, and worse on validation: not selected
            for row, flag in ((selected, math.nan), (last, 1.0)):
                row.update(run=f"m-{trial}", hparams=json.dumps({"featurizer": "MLP", "modreg_scale": 0.1}))
                row[COLLAPSED] = flag
                rows.append(row)
        return split_by_hparams(Collection(pd.DataFrame(rows)), ["modreg_scale"])

    assert verdict_of(sweep(0.9)).best.collapsed == 0  # 90% on validation: a network, whatever came later
    assert verdict_of(sweep(0.12)).best.collapsed == 4  # 12% of 10 classes: at chance (within 5 points)
    # a checkpoint that evaluated neither (the oracle reads only the held-out environment) takes the
    # run's last flag
    fallback = sweep(0.9)
    fallback.records.loc[fallback.records["step"] == 100, [f"env{i}_out_acc" for i in range(1, 6)]] = math.nan
    oracle = dataclasses.replace(CLAIM, selection="oracle")
    assert verdict_of(fallback, oracle).best.collapsed == 4


def test_a_gain_from_collapsed_runs_is_not_credited_but_a_refutation_stands():
    # STRONG would be 'reproduced' (+3.2 points in every trial, claimed +0.98); one collapsed run withholds it
    assert verdict_of(grid({1.0: DEFAULTS, 0.1: STRONG})).verdict == "reproduced"
    v = verdict_of(grid({1.0: DEFAULTS, 0.1: STRONG}, collapsed=[0, 0, 1, 0]))
    assert (v.verdict, v.reason) == ("gain from collapsed runs", "1 of 4 of the best point's selected runs are at "
                                                                 "chance on their own training environments")
    assert "gain from collapsed runs (1 of 4 of the best point's" in verdict_markdown([v])
    # a claim refuted with collapsed runs at the best point is refuted still: collapse only inflates a gain
    weak = dataclasses.replace(CLAIM, method_mean=CLAIM.base_mean + 10)
    small = [0.01, -0.005, 0.008, 0.0]  # a small, not significant gain whose interval lies below +10
    v = judge(weak, grid({1.0: DEFAULTS, 0.1: small, 0.3: WEAK}, collapsed=[1, 1, 1, 1]),
              default_rows([weak], ["modreg_scale"]))
    assert v.best.name.endswith("(modreg_scale=0.1)") and v.best.mean > 0 and v.best.collapsed == 4
    assert v.verdict == "refuted"


def test_markdown_and_csv_show_the_paper_and_ours():
    v = verdict_of(grid({1.0: DEFAULTS, 0.1: STRONG}))
    md = verdict_markdown([v])
    assert "| R-MNIST MLP, ERM | 94.45 → 95.43 (+0.98)" in md
    base, best = 100 * np.mean(BASE), 100 * np.mean([b + d for b, d in zip(BASE, STRONG)])
    assert f"{base:.1f} → {best:.1f}" in md
    assert "modreg_scale=0.1" in md and "reproduced" in md
    assert "chosen on test accuracy, the choice most favourable to the method" in md
    csv = pd.read_csv(__import__("io").StringIO(verdict_csv([v])))
    assert csv["verdict"].tolist() == ["reproduced"] and csv["points"].tolist() == [2]
    assert not math.isnan(v.best.p_holm)


def test_claims_file_errors_are_one_line(tmp_path):
    claims = read_claims("modreg_claims")
    assert [c.name for c in claims][:2] == ["C-MNIST MLP, ERM", "C-MNIST MLP, IRM"]
    assert claims[0].gain == pytest.approx(36.91 - 34.27) and claims[2].featurizers == ("auto", "MNIST_CNN")
    with pytest.raises(DomaingenError, match="^claims nope: no such file and no shipped claims file of that name"):
        read_claims("nope")
    bad = tmp_path / "bad.csv"
    bad.write_text("claim,dataset\nx,RotatedMNIST\n")
    with pytest.raises(DomaingenError, match="lacks the column\\(s\\) test_env, featurizer"):
        read_claims(bad)
    header = "claim,dataset,test_env,featurizer,base,method,base_mean,method_mean,selection,source\n"
    bad.write_text(header + "x,RotatedMNIST,0,MLP,ERM,ERM+ModReg,94,95,best,paper\n")
    with pytest.raises(DomaingenError, match="line 2: selection 'best' is not one of"):
        read_claims(bad)
    bad.write_text(header + "x,RotatedMNIST,0,MLP,ERM,ERM+ModReg,high,95,training,paper\n")
    with pytest.raises(DomaingenError, match="line 2: base_mean 'high' is not a number"):
        read_claims(bad)
    bad.write_text(header + "x,RotatedMNIST,7,MLP,ERM,ERM+ModReg,94,95,training,paper\n")
    with pytest.raises(DomaingenError, match="line 2: test_env '7' is not an environment of RotatedMNIST"):
        read_claims(bad)


def test_verdict_command_refuses_a_missing_claims_file(tmp_path, capsys):
    (tmp_path / "sweep").mkdir()
    code = main(["collect", "verdict", "--input_dir", str(tmp_path / "sweep"), "--claims", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "claims file" in err[0] and "not found" in err[0]


def test_a_grid_point_may_stand_for_the_defaults():
    rows = default_rows([CLAIM], ["modreg_scale", "modreg_alpha"], {"modreg_scale": 0.1, "modreg_alpha": 6.93e-09})
    assert rows == {"ERM+ModReg": ["ERM+ModReg (modreg_scale=1.0, modreg_alpha=6.93e-10)",
                                   "ERM+ModReg (modreg_scale=0.1, modreg_alpha=6.93e-09)"]}
    v = judge(CLAIM, grid({0.1: DEFAULTS, 0.01: WEAK}), default_rows([CLAIM], ["modreg_scale"], {"modreg_scale": 0.1}))
    assert v.defaults.name == "ERM+ModReg (modreg_scale=0.1)" and v.verdict == REFUTED


@pytest.mark.parametrize("specs, message", [
    (["modreg_scale"], "--defaults takes HPARAM=VALUE (e.g. modreg_scale=0.1), got 'modreg_scale'"),
    (["lr=0.1"], "--defaults lr: not among --split_by (modreg_scale)"),
])
def test_bad_defaults_are_one_line(specs, message):
    from domaingen.tables.verdict import parse_equivalents

    with pytest.raises(DomaingenError, match=f"^{__import__('re').escape(message)}$"):
        parse_equivalents(specs, ["modreg_scale"])
    assert parse_equivalents(["modreg_scale=0.1", "modreg_pi=logit"], ["modreg_scale", "modreg_pi"]) == {
        "modreg_scale": 0.1, "modreg_pi": "logit"}


def test_grid_rows_are_ordered_by_their_values():
    from domaingen.tables.reporting import build_tables

    tables = build_tables(grid({1.0: DEFAULTS, 1e-05: WEAK, 0.0001: STRONG, 0.01: DEFAULTS}), ["training"])
    assert list(tables[0].rows) == ["ERM", "ERM+ModReg (modreg_scale=1e-05)", "ERM+ModReg (modreg_scale=0.0001)",
                                    "ERM+ModReg (modreg_scale=0.01)", "ERM+ModReg (modreg_scale=1.0)"]


# ColoredMNIST, every environment held out in turn, three trials: held-out accuracy [environment][trial]
CMNIST = {"ERM": [[0.70, 0.72, 0.71], [0.73, 0.72, 0.74], [0.10, 0.12, 0.11]],
          "SANDMask": [[0.69, 0.73, 0.70], [0.72, 0.74, 0.73], [0.20, 0.15, 0.30]]}


def cmnist_records(accuracies=CMNIST, dataset="ColoredMNIST", featurizer="MLP", step=100, protocol="paired"):
    rows = []
    for algorithm, by_env in accuracies.items():
        for env, trials in enumerate(by_env):
            for trial, test in enumerate(trials):
                ins = [0.9, 0.9, 0.9]
                ins[env] = test
                row = rec(algorithm, [env], 0, trial, step, ins, [0.9, 0.9, 0.9], dataset=dataset)
                row["run"] = f"{dataset}-{algorithm}-{env}-{trial}-{step}"
                row["hparams"] = json.dumps({"featurizer": featurizer})
                row["protocol"] = protocol
                rows.append(row)
    return rows


def test_an_average_claim_pairs_per_trial_averages():
    claim = Claim("C-MNIST avg", "ColoredMNIST", "Avg", ("MLP",), "ERM", "SANDMask", 57.8, 73.0, "training", "paper")
    v = judge(claim, Collection(pd.DataFrame(cmnist_records())))
    # by hand: per trial, the mean over the three held-out environments, SAND-mask minus ERM
    expected = [sum(CMNIST["SANDMask"][e][t] - CMNIST["ERM"][e][t] for e in range(3)) / 3 for t in range(3)]
    assert v.points[0].differences == pytest.approx(expected)
    assert v.base_cell.values == pytest.approx([sum(CMNIST["ERM"][e][t] for e in range(3)) / 3 for t in range(3)])
    assert v.verdict == OPEN and v.best.name == "SANDMask"  # one point only: "refuted" needs a grid point too


def test_trial_average_keeps_the_trials_every_environment_has():
    from domaingen.tables.reporting import Cell
    from domaingen.tables.verdict import trial_average

    def cell(values, seeds):
        return Cell(values, trace=[{"trial_seed": s, "hparams_seed": 0, "step": 1, "run": f"r{s}"} for s in seeds])

    avg = trial_average([cell([0.1, 0.2, 0.3], [0, 1, 2]), cell([0.5, 0.7], [2, 0])])
    assert avg.values == pytest.approx([(0.1 + 0.7) / 2, (0.3 + 0.5) / 2])
    assert [t["trial_seed"] for t in avg.trace] == [0, 2] and avg.trace[0]["parts"] == [("r0", 1), ("r0", 1)]


def test_the_protocols_table_lists_the_base_under_each_protocol():
    from domaingen.tables.verdict import protocol_frame

    claim = Claim("C-MNIST MLP, ERM", "IRMColoredMNIST", "-90%", ("IRM_MLP",), "ERM", "ERM+ModReg", 34.27, 36.91,
                  "training", "paper", ("ColoredMNIST",))
    irm_paper = cmnist_records({"ERM": [[0.5] * 3, [0.5] * 3, [0.17, 0.16, 0.18]]}, "IRMColoredMNIST", "IRM_MLP", 500)
    domainbed = cmnist_records({"ERM": CMNIST["ERM"]}, "ColoredMNIST", "MLP", 5000, "domainbed")
    longer = cmnist_records({"ERM": [[0.5] * 3, [0.5] * 3, [0.30, 0.30, 0.33]]}, "ColoredMNIST", "MLP", 9000)
    frame = protocol_frame([claim], Collection(pd.DataFrame(irm_paper + domainbed + longer)))
    assert frame[["dataset", "featurizer", "protocol", "last step"]].values.tolist() == [
        ["IRMColoredMNIST", "IRM_MLP", "paired", 500], ["ColoredMNIST", "MLP", "domainbed", 5000],
        ["ColoredMNIST", "MLP", "paired", 9000]]
    d = np.array([0.10, 0.12, 0.11])
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert frame["ours [95% CI]"][1] == f"{100 * d.mean():.1f} [{100 * (d.mean() - half):.1f}, {100 * (d.mean() + half):.1f}] (n=3)"
    assert frame["paper"].tolist() == ["34.27"] * 3 and set(frame["selection"]) == {"training"}
    md = verdict_markdown([judge(claim, Collection(pd.DataFrame(irm_paper)))], frame)
    assert "### The base under each protocol tried" in md and "| ColoredMNIST " in md


def test_claims_files_add_up_and_name_their_compare_datasets(tmp_path):
    from domaingen.tables.verdict import read_claims_files

    claims = read_claims_files(["modreg_claims", "sandmask_claims"])
    sand = [c for c in claims if c.method == "SANDMask"]
    assert len(claims) == len(read_claims("modreg_claims")) + len(sand) and sand[0].test_env == "Avg"
    assert claims[0].compare == ("ColoredMNIST",) and sand[0].compare == ()
    bad = tmp_path / "bad.csv"
    header = "claim,dataset,test_env,featurizer,base,method,base_mean,method_mean,selection,source,compare\n"
    bad.write_text(header + "x,ColoredMNIST,-90%,MLP,ERM,SANDMask,10,12,training,paper,RotatedMNIST\n")
    with pytest.raises(DomaingenError, match="^claims file .* line 2: test_env '-90%' is not an environment of "
                                             "RotatedMNIST"):
        read_claims(bad)


def test_sources_of_two_protocols_are_judged_apart(tmp_path, capsys):
    """A paired sweep and a DomainBed-protocol sweep never share a table: each claim is judged within the
    protocol whose runs have its dataset, and the protocols table lists both; a --split_by key no source
    has is still one line."""
    from test_comparisons import TEST, write_sweep

    write_sweep(tmp_path / "paired")
    write_sweep(tmp_path / "domainbed", {"ERM": [0.1, 0.2], "ERM+ModReg": [0.3, 0.4]}, protocol="domainbed")
    claims = tmp_path / "claims.csv"
    claims.write_text("claim,dataset,test_env,featurizer,base,method,base_mean,method_mean,selection,source\n"
                      "c,ColoredMNIST,+90%,auto,ERM,ERM+ModReg,50,52,training,paper\n")
    argv = ["-q", "collect", "verdict", "--input_dir", str(tmp_path / "paired"), str(tmp_path / "domainbed"),
            "--claims", str(claims), "--format", "csv"]
    capsys.readouterr()
    assert main(argv) == 0
    row = pd.read_csv(__import__("io").StringIO(capsys.readouterr().out)).iloc[0]
    # the paired sweep's runs (the first source with the dataset): ERM 0.5, 0.6 (0.7 unpaired) -> 55.0
    assert row["ours: base → best method"].startswith(f"{100 * np.mean(TEST['ERM']):.1f} → ")
    assert main([*argv, "--split_by", "nothing"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "domaingen: error: --split_by nothing: no run has this hyperparameter")


def test_judge_sources_judges_each_claim_within_the_first_protocol_holding_its_dataset():
    """Two sources of different protocols: the claim is judged on the first whose runs have its
    dataset (the same verdict as judging that source alone), never on both merged."""
    from domaingen.tables.verdict import judge_sources

    paired = protocol_sweep({1.0: DEFAULTS, 0.3: STRONG}, "paired")
    other = protocol_sweep({1.0: WEAK, 0.3: WEAK}, "domainbed")
    verdicts, protocols = judge_sources([CLAIM], [("a", paired), ("b", other)], ["modreg_scale"])
    alone = verdict_of(grid({1.0: DEFAULTS, 0.3: STRONG}))
    assert verdicts[0].verdict == alone.verdict == "reproduced"
    assert [(p.name, p.differences) for p in verdicts[0].points] == [(p.name, p.differences) for p in alone.points]
    assert sorted(protocols["protocol"]) == ["domainbed", "paired"]
    first, _ = judge_sources([CLAIM], [("b", other), ("a", paired)], ["modreg_scale"])
    assert first[0].verdict != "reproduced"  # the DomainBed-protocol source comes first: its losses are judged


def test_a_claim_is_judged_within_the_protocol_holding_its_featurizer():
    """A paired CNN sweep and a DomainBed-protocol MLP sweep of one dataset: the MLP claim is judged on
    the MLP sweep (as alone), though the CNN sweep comes first and holds the dataset."""
    from domaingen.tables.verdict import judge_sources

    cnn = protocol_sweep({1.0: WEAK, 0.3: WEAK}, "paired", "MNIST_CNN")
    mlp = protocol_sweep({1.0: DEFAULTS, 0.3: STRONG}, "domainbed")
    verdicts, _ = judge_sources([CLAIM], [("cnn", cnn), ("mlp", mlp)], ["modreg_scale"])
    alone = verdict_of(grid({1.0: DEFAULTS, 0.3: STRONG}))
    assert verdicts[0].verdict == alone.verdict == "reproduced"
    assert [(p.name, p.differences) for p in verdicts[0].points] == [(p.name, p.differences) for p in alone.points]
    cnn_claim = dataclasses.replace(CLAIM, featurizers=("MNIST_CNN",))
    cnn_verdicts, _ = judge_sources([cnn_claim], [("cnn", cnn), ("mlp", mlp)], ["modreg_scale"])
    assert cnn_verdicts[0].verdict == REFUTED


def test_holm_counts_only_the_points_with_a_test_and_the_table_says_how_many():
    # a third point run once has no test: Holm's adjustment is over the two tested points, and the table's
    # `tested` column says 2 of 3; that untested point, best on its mean, is still the best point
    v = verdict_of(grid({1.0: DEFAULTS, 0.1: STRONG, 0.3: [0.05]}))
    by_name = {p.name: p for p in v.points}
    once = by_name["ERM+ModReg (modreg_scale=0.3)"]
    assert once.n == 1 and math.isnan(once.p_value) and math.isnan(once.p_holm)
    raw_strong = stats.ttest_1samp(np.array(STRONG), 0).pvalue
    raw_defaults = stats.ttest_1samp(np.array(DEFAULTS), 0).pvalue
    assert raw_strong < raw_defaults
    assert by_name["ERM+ModReg (modreg_scale=0.1)"].p_holm == pytest.approx(2 * raw_strong)
    assert by_name["ERM+ModReg (modreg_scale=1.0)"].p_holm == pytest.approx(min(1.0, max(2 * raw_strong, raw_defaults)))
    assert v.best is once and v.verdict == REPRODUCED
    csv = pd.read_csv(__import__("io").StringIO(verdict_csv([v])))
    assert csv[["points", "tested"]].values.tolist() == [[3, 2]]
    md = verdict_markdown([v])
    assert "+5.0 (n=1)" in md and "Holm-adjusted over the claim's tested points" in md


def test_claims_of_one_dataset_with_different_paper_numbers_each_get_their_protocol_rows():
    from domaingen.tables.verdict import protocol_frame

    def claim(name, paper, selection="training"):
        return Claim(name, "ColoredMNIST", "-90%", ("MLP",), "ERM", "ERM+ModReg", paper, paper + 1, selection, "paper")

    mlp = cmnist_records({"ERM": CMNIST["ERM"]}, "ColoredMNIST", "MLP", 5000)
    cnn = cmnist_records({"ERM": [[0.5] * 3, [0.5] * 3, [0.20, 0.22, 0.24]]}, "ColoredMNIST", "MNIST_CNN", 5000)
    claims = [claim("MLP row", 34.27), claim("CNN row", 35.23), claim("MLP again", 34.27),
              claim("MLP, oracle", 34.27, "oracle")]
    frame = protocol_frame(claims, Collection(pd.DataFrame(mlp + cnn)))
    # "MLP again" repeats the first claim's base, paper number and selection, so its rows would repeat them
    assert frame[["claim", "paper", "featurizer", "selection"]].values.tolist() == [
        ["MLP row", "34.27", "MLP", "training"], ["MLP row", "34.27", "MNIST_CNN", "training"],
        ["CNN row", "35.23", "MLP", "training"], ["CNN row", "35.23", "MNIST_CNN", "training"],
        ["MLP, oracle", "34.27", "MLP", "oracle"], ["MLP, oracle", "34.27", "MNIST_CNN", "oracle"]]
    cnn_mean = 100 * np.mean([0.20, 0.22, 0.24])
    assert frame["ours [95% CI]"][3].startswith(f"{cnn_mean:.1f} [")


def floor_grid(points: int, trials: int = 10) -> Collection:
    """ERM and `points` ERM+ModReg scales, each gaining 2.5 to 3.4 points in every one of `trials` trials."""
    base = [0.80 + 0.001 * t for t in range(trials)]
    rows = run_records("ERM", base, {"featurizer": "MLP"}, "erm")
    for i in range(points):
        gains = [0.025 + 0.001 * ((t * 7 + i) % 10) for t in range(trials)]
        rows += run_records("ERM+ModReg", [b + g for b, g in zip(base, gains)],
                            {"featurizer": "MLP", "modreg_scale": 1.0 + i}, f"m{i}")
    return split_by_hparams(Collection(pd.DataFrame(rows)), ["modreg_scale"])


def test_the_signed_rank_floor_under_holm_and_the_t_test_that_has_none():
    # 26 points, each ahead in all ten trials: each signed-rank p is 2 / 2^10, and Holm multiplies the
    # smallest by 26 (0.0508, and the rest stay at or above it): no point can be called significant. The
    # t-test's p of each is below 1e-6, so Holm's 26x leaves it far below 0.05.
    collection = floor_grid(26)
    signed = verdict_of_test(collection, "wilcoxon")
    assert [p.p_value for p in signed.points] == pytest.approx([2 / 1024] * 26)
    assert min(p.p_holm for p in signed.points) == pytest.approx(26 * 2 / 1024) and 26 * 2 / 1024 > 0.05
    assert signed.verdict == INCONCLUSIVE
    assert verdict_of_test(collection, "auto").verdict == INCONCLUSIVE  # ten pairs: auto is the signed-rank test
    by_t = verdict_of_test(collection, "t")
    assert by_t.verdict == REPRODUCED and max(p.p_holm for p in by_t.points) < 1e-4
    # with 25 points the signed-rank test's Holm floor is 25 * 2 / 1024 = 0.0488: it can reject again
    assert verdict_of_test(floor_grid(25), "wilcoxon").verdict == REPRODUCED
    assert verdict_of_test(collection, "t").verdict == judge(CLAIM, collection, default_rows([CLAIM], ["modreg_scale"])).verdict


def verdict_of_test(collection: Collection, test: str):
    return judge(CLAIM, collection, default_rows([CLAIM], ["modreg_scale"]), test)


def test_the_verdict_names_its_test_and_may_add_another(tmp_path, capsys):
    from test_comparisons import write_sweep

    write_sweep(tmp_path / "sweep")
    claims = tmp_path / "claims.csv"
    claims.write_text("claim,dataset,test_env,featurizer,base,method,base_mean,method_mean,selection,source\n"
                      "c,ColoredMNIST,+90%,auto,ERM,ERM+ModReg,50,52,training,paper\n")
    argv = ["-q", "collect", "verdict", "--input_dir", str(tmp_path / "sweep"), "--claims", str(claims)]
    capsys.readouterr()
    assert main(argv) == 0
    md = capsys.readouterr().out
    assert "p: paired t-test (two-sided), Holm-adjusted over the claim's tested points" in md
    assert "another test" not in md
    assert main([*argv, "--test", "wilcoxon", "--also_test", "t"]) == 0
    md = capsys.readouterr().out
    assert "p: Wilcoxon signed-rank test (exact, two-sided), Holm-adjusted" in md
    assert "### The same claims judged with another test, t (p: paired t-test (two-sided)" in md
    assert main([*argv, "--also_test", "auto", "--format", "csv"]) == 0
    csv = pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))
    assert csv["test"].tolist() == ["t", "auto"] and csv["claim"].tolist() == ["c", "c"]
    assert main([*argv, "--also_test", "t"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["domaingen: error: --also_test t is --test's own; name another test (t, wilcoxon or auto)"]
