"""domaingen.tables.statistics against textbook numbers, and the `collect` views built on it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from domaingen.tables.statistics import (average_ranks, friedman_nemenyi, holm, iqm, paired_test,
                                         stratified_bootstrap)

# Demšar (JMLR 2006), Table 6: AUC of four C4.5 variants on 14 data sets. Voting's C4.5+cf is printed
# 0.975 like C4.5+m+cf's but ranked ahead of it (2 against 3) in the paper: 0.97501 keeps that order.
DEMSAR = pd.DataFrame(
    [(0.763, 0.768, 0.771, 0.798), (0.599, 0.591, 0.590, 0.569), (0.954, 0.971, 0.968, 0.967),
     (0.628, 0.661, 0.654, 0.657), (0.882, 0.888, 0.886, 0.898), (0.936, 0.931, 0.916, 0.931),
     (0.661, 0.668, 0.609, 0.685), (0.583, 0.583, 0.563, 0.625), (0.775, 0.838, 0.866, 0.875),
     (1.000, 1.000, 1.000, 1.000), (0.940, 0.962, 0.965, 0.962), (0.619, 0.666, 0.614, 0.669),
     (0.972, 0.981, 0.97501, 0.975), (0.957, 0.978, 0.946, 0.970)],
    columns=["C4.5", "C4.5+m", "C4.5+cf", "C4.5+m+cf"])


def test_demsar_average_ranks_friedman_and_nemenyi():
    result = friedman_nemenyi(DEMSAR)
    assert average_ranks(DEMSAR).round(3).tolist() == [3.143, 2.000, 2.893, 1.964]
    assert result.chi2 == pytest.approx(9.28, abs=0.005)
    assert result.f_statistic == pytest.approx(3.69, abs=0.005)
    # F with 3 and 39 degrees of freedom: Demšar's critical value at 0.05 is 2.85, so p < 0.05
    assert stats.f.ppf(0.95, 3, 39) == pytest.approx(2.85, abs=0.005) and result.p_f < 0.05
    assert result.q_alpha == pytest.approx(2.569, abs=0.0005)
    assert result.critical_difference == pytest.approx(1.25, abs=0.005)
    # 3.143 - 1.964 = 1.179 < CD: Nemenyi separates no two of them (Demšar's reading)
    assert result.groups == [["C4.5+m+cf", "C4.5+m", "C4.5+cf", "C4.5"]]


def test_friedman_without_ties_is_scipys():
    scores = pd.DataFrame([[0.1, 0.2, 0.3], [0.3, 0.1, 0.2], [0.2, 0.3, 0.5], [0.6, 0.4, 0.5]], columns=list("abc"))
    assert friedman_nemenyi(scores).chi2 == pytest.approx(stats.friedmanchisquare(*scores.T.to_numpy()).statistic)


def test_demsar_wilcoxon_of_c45_with_m():
    # Section 3.1.3: R+ = 93, R- = 12 (the zero difference of mushroom split between them), 14 data sets
    result = paired_test((DEMSAR["C4.5+m"] - DEMSAR["C4.5"]).tolist())
    assert result.test == "wilcoxon" and result.n == 14 and result.statistic == 12.0


def test_wilcoxon_by_hand():
    # differences 1, 2, -3, 4, 5, 6 (hundredths): |d| ranks 1..6, R- = 3, R+ = 18, T = 3. Exactly, the sign
    # patterns whose negative ranks sum to 3 or less are {}, {1}, {2}, {3}, {1, 2}: 5 of 2^6 = 64, doubled
    result = paired_test([0.01, 0.02, -0.03, 0.04, 0.05, 0.06])
    assert result.test == "wilcoxon" and result.statistic == 3.0
    assert result.p_value == pytest.approx(2 * 5 / 64)
    subsets = sum(sum(r for i, r in enumerate(range(1, 7)) if mask >> i & 1) <= 3 for mask in range(64))
    assert subsets == 5


def test_small_n_takes_the_paired_t_test():
    d = [0.01, 0.03, 0.02]
    result = paired_test(d)
    t = np.mean(d) / (np.std(d, ddof=1) / math.sqrt(3))  # 0.02 / (0.01 / sqrt 3) = 2 sqrt 3
    assert result.test == "t" and result.statistic == pytest.approx(2 * math.sqrt(3))
    assert result.p_value == pytest.approx(2 * stats.t.sf(t, 2))


def test_a_named_test_holds_for_every_n():
    # ten differences, all positive: the exact signed-rank test's smallest p, 2 / 2^10 (only the all-positive
    # and all-negative sign patterns are as extreme); the t-test's p from t = mean / (sd / sqrt n) by hand
    d = [0.031, 0.024, 0.035, 0.029, 0.041, 0.022, 0.033, 0.027, 0.038, 0.030]
    assert paired_test(d).p_value == paired_test(d, "wilcoxon").p_value == pytest.approx(2 / 2 ** 10)
    t = np.mean(d) / (np.std(d, ddof=1) / math.sqrt(10))
    forced = paired_test(d, "t")
    assert forced.test == "t" and forced.statistic == pytest.approx(t)
    assert forced.p_value == pytest.approx(2 * stats.t.sf(t, 9)) and forced.p_value < 1e-6
    # and four differences under the signed-rank test: at best 2 / 2^4, whatever their size
    few = paired_test([0.01, 0.03, 0.02, 0.04], "wilcoxon")
    assert few.test == "wilcoxon" and few.p_value == pytest.approx(2 / 16)


def test_an_unknown_test_is_one_line():
    from domaingen.errors import DomaingenError

    with pytest.raises(DomaingenError, match=r"^paired test 'sign' is not one of auto, t, wilcoxon$"):
        paired_test([0.01, 0.02], "sign")


@pytest.mark.parametrize("differences, reason", [
    ([0.02], "no test: 1 paired trial, a paired test needs 2 or more"),
    ([], "no test: 0 paired trials, a paired test needs 2 or more"),
    ([0.0, 0.0, 0.0], "no test: all 3 paired differences are 0"),
    ([0.01, 0.01], "no test: all 2 paired differences are equal, no spread for a t-test"),
])
def test_no_test_says_why(differences, reason):
    result = paired_test(differences)
    assert not result.made and math.isnan(result.p_value) and result.reason == reason


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> monotone 0.02, 0.03, 0.06, 0.06
    adjusted = holm([0.01, 0.04, 0.03, 0.005, math.nan])
    assert adjusted[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(adjusted[4])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])


def test_iqm_and_its_bootstrap():
    assert iqm(np.arange(1, 9)) == pytest.approx(4.5)  # the middle half of 1..8: 3, 4, 5, 6
    constant = stratified_bootstrap({"a": [0.7, 0.7, 0.7], "b": [0.7, 0.7]}, iqm, reps=200)
    assert (constant.estimate, constant.low, constant.high) == pytest.approx((0.7, 0.7, 0.7))
    # each stratum's resample keeps its size: a dataset of one run is in every replicate as itself
    runs = {"a": [0.0, 1.0, 0.0, 1.0], "b": [10.0]}
    interval = stratified_bootstrap(runs, lambda s: float(np.max(s)), reps=200)
    assert (interval.estimate, interval.low, interval.high) == (10.0, 10.0, 10.0)
    mean = stratified_bootstrap(runs, lambda s: float(np.mean(s)), reps=2000)
    assert mean.estimate == pytest.approx(2.4) and mean.low < 2.4 < mean.high
    assert mean.low >= 2.0 and mean.high <= 2.8  # the extremes: a's four draws all 0 or all 1


# ---- the collect views on a tiny sweep ----

import io  # noqa: E402
import json  # noqa: E402

from domaingen.cli.main import main  # noqa: E402
from domaingen.run.rundir import to_json  # noqa: E402
from test_selection import rec  # noqa: E402

# test accuracy of env 0 per (dataset, algorithm), one value per trial: training-domain validation picks step 1
SCORES = {
    "ToyA": {"ERM": [0.50, 0.60, 0.70], "IRM": [0.40, 0.50, 0.45], "Mixup": [0.55, 0.65, 0.60]},
    "ToyB": {"ERM": [0.80, 0.70, 0.75], "IRM": [0.85, 0.80, 0.90], "Mixup": [0.60, 0.65, 0.70]},
    "ToyC": {"ERM": [0.30, 0.35, 0.40], "IRM": [0.20, 0.25, 0.30], "Mixup": [0.31, 0.36, 0.50]},
}


def write_datasets(root, scores=SCORES) -> str:
    """A sweep of one held-out environment (env 0) per dataset; each run has steps 0 and 1, step 1 validating best."""
    for dataset, by_algorithm in scores.items():
        for algorithm, tests in by_algorithm.items():
            for trial, test in enumerate(tests):
                run = root / f"{dataset}_{algorithm}_{trial}"
                run.mkdir(parents=True)
                args = {"dataset": dataset, "algorithm": algorithm, "test_envs": [0], "hparams_seed": 0,
                        "trial_seed": trial, "output_dir": str(run)}
                lines = []
                for step in (0, 1):
                    row = rec(algorithm, [0], 0, trial, step, [test if step else 0.1, .9, .9], [.5, .6 + step / 10, .6 + step / 10])
                    lines.append(to_json({**{k: v for k, v in row.items() if k.startswith("env") or k == "step"},
                                          "args": args, "hparams": {}, "data_source": "toy"}))
                (run / "results.jsonl").write_text("\n".join(lines) + "\n")
                (run / "args.json").write_text(json.dumps(args))
                (run / "done").write_text("{}")
    return str(root)


def run_collect(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert main(["-q", "collect", *argv]) == 0
    return capsys.readouterr().out


def refused(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert main(["collect", *argv]) == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_ranks_view_in_three_formats(tmp_path, capsys):
    sweep = write_datasets(tmp_path / "s")
    means = pd.DataFrame({a: [np.mean(SCORES[d][a]) for d in SCORES] for a in ("ERM", "IRM", "Mixup")}, index=list(SCORES))
    expected = friedman_nemenyi(means)
    # by hand: ToyA Mixup 1, ERM 2, IRM 3; ToyB IRM 1, ERM 2, Mixup 3; ToyC Mixup 1, ERM 2, IRM 3
    assert expected.ranks.tolist() == pytest.approx([2.0, 7 / 3, 5 / 3])
    csv = pd.read_csv(io.StringIO(run_collect(capsys, "ranks", "--input_dir", sweep, "--selection", "training",
                                              "--format", "csv")))
    assert csv["algorithm"].tolist() == ["Mixup", "ERM", "IRM"]
    assert csv["average rank"].tolist() == pytest.approx([5 / 3, 2.0, 7 / 3])
    assert csv["ToyB rank"].tolist() == [3.0, 2.0, 1.0]
    assert csv["ToyA acc"].tolist() == pytest.approx([60.0, 60.0, 45.0])
    assert f"CD = {expected.critical_difference:.3f}" in csv["notes"][0]
    markdown = run_collect(capsys, "ranks", "--input_dir", sweep, "--selection", "training")
    assert "| Mixup       | 60.0       | 1.00        |" in markdown
    assert f"chi2_F = {expected.chi2:.3f}" in markdown and "Nemenyi critical difference" in markdown
    latex = run_collect(capsys, "ranks", "--input_dir", sweep, "--selection", "training", "--format", "latex")
    assert r"Mixup & 60.0 & 1.00" in latex and r"\begin{tabular}" in latex


def test_intervals_view_in_three_formats(tmp_path, capsys):
    sweep = write_datasets(tmp_path / "s")
    csv = pd.read_csv(io.StringIO(run_collect(capsys, "intervals", "--input_dir", sweep, "--selection", "training",
                                              "--format", "csv", "--reps", "500")))
    erm = csv.set_index("algorithm").loc["ERM"]
    pooled = np.concatenate([SCORES[d]["ERM"] for d in SCORES])
    assert erm["runs"] == 9 and erm["mean"] == pytest.approx(100 * pooled.mean())
    assert erm["IQM"] == pytest.approx(100 * stats.trim_mean(pooled, 0.25))
    assert erm["mean low"] <= erm["mean"] <= erm["mean high"]
    again = stratified_bootstrap({d: SCORES[d]["ERM"] for d in SCORES}, iqm, reps=500)
    assert (erm["IQM low"], erm["IQM high"]) == pytest.approx((100 * again.low, 100 * again.high))
    markdown = run_collect(capsys, "intervals", "--input_dir", sweep, "--selection", "training", "--reps", "500")
    assert f"| ERM         | 9      | {100 * pooled.mean():.1f} [{erm['mean low']:.1f}, {erm['mean high']:.1f}]" in markdown
    latex = run_collect(capsys, "intervals", "--input_dir", sweep, "--selection", "training", "--format", "latex",
                        "--reps", "500")
    assert f"ERM & 9 & {100 * pooled.mean():.1f} [{erm['mean low']:.1f}, {erm['mean high']:.1f}]" in latex


def test_one_dataset_gives_one_line(tmp_path, capsys):
    sweep = write_datasets(tmp_path / "s", {"ToyA": SCORES["ToyA"]})
    for view in ("ranks", "intervals"):
        assert refused(capsys, view, "--input_dir", sweep, "--selection", "training") == (
            f"domaingen: error: collect {view} compares algorithms over datasets and needs two or more; these runs "
            "have 1: ToyA (collect tables compares within one)")


def test_baseline_test_in_every_cell(tmp_path, capsys):
    sweep = write_datasets(tmp_path / "s")
    csv = pd.read_csv(io.StringIO(run_collect(capsys, "--input_dir", sweep, "--selection", "training",
                                              "--baseline", "ERM", "--format", "csv")))
    paired = csv[csv["table"] == "paired"]
    assert sorted(set(paired["algorithm"])) == ["IRM − ERM", "Mixup − ERM"]
    toy_a = paired[paired["dataset"] == "ToyA"].set_index("algorithm")
    d = np.subtract(SCORES["ToyA"]["IRM"], SCORES["ToyA"]["ERM"])
    p_irm = stats.ttest_rel(SCORES["ToyA"]["IRM"], SCORES["ToyA"]["ERM"]).pvalue
    p_mixup = stats.ttest_rel(SCORES["ToyA"]["Mixup"], SCORES["ToyA"]["ERM"]).pvalue
    assert toy_a.loc["IRM − ERM", "mean"] == pytest.approx(d.mean())
    assert toy_a.loc["IRM − ERM", "test"] == "t" and toy_a.loc["IRM − ERM", "p_value"] == pytest.approx(p_irm)
    # Holm over the table's two tests
    assert toy_a["p_holm"].tolist() == pytest.approx(holm([p_irm, p_mixup]))
    markdown = run_collect(capsys, "--input_dir", sweep, "--selection", "training", "--baseline", "ERM")
    assert f"p={holm([p_irm, p_mixup])[0]:.2g} (t)" in markdown
    latex = run_collect(capsys, "--input_dir", sweep, "--selection", "training", "--baseline", "ERM",
                        "--format", "latex")
    assert f"p={holm([p_irm, p_mixup])[0]:.2g} (t)" in latex and "Holm-adjusted" in latex
    assert refused(capsys, "--input_dir", sweep, "--baseline", "CORAL") == (
        "domaingen: error: --baseline CORAL is in no table; the tables have: ERM, IRM, Mixup")


def test_the_paired_tables_test_is_named_and_holds_for_every_n(tmp_path, capsys):
    # three trials: auto takes the t-test; --test wilcoxon the exact signed-rank test, whose p for three
    # differences of one sign is 2 / 2^3 whatever their size (IRM - ERM on ToyB: +5, +10, +15 points)
    sweep = write_datasets(tmp_path / "s", {"ToyB": SCORES["ToyB"]})
    base = ["--input_dir", sweep, "--selection", "training", "--paired", "IRM:ERM", "--format", "csv"]
    row = lambda text: pd.read_csv(io.StringIO(text)).query("table == 'paired'").iloc[0]  # noqa: E731
    auto = row(run_collect(capsys, *base))
    assert auto["test"] == "t" and auto["p_value"] == pytest.approx(
        stats.ttest_rel(SCORES["ToyB"]["IRM"], SCORES["ToyB"]["ERM"]).pvalue)
    signed = row(run_collect(capsys, *base, "--test", "wilcoxon"))
    assert signed["test"] == "wilcoxon" and signed["p_value"] == pytest.approx(2 / 8)
    markdown = run_collect(capsys, *base[:-2], "--test", "wilcoxon")
    assert "(W: Wilcoxon signed-rank, exact, for every n; with n pairs its p is at least 2/2^n)" in markdown
    assert "p=0.25 (W)" in markdown
    assert refused(capsys, "--input_dir", sweep, "--test", "t") == (
        "domaingen: error: --test t says how --paired or --baseline cells are tested; add one of them")


def test_one_paired_trial_says_why_in_a_footnote(tmp_path, capsys):
    sweep = write_datasets(tmp_path / "s", {"ToyA": {"ERM": [0.5, 0.6], "IRM": [0.4]}})
    markdown = run_collect(capsys, "--input_dir", sweep, "--selection", "training", "--paired", "IRM:ERM")
    assert "| IRM − ERM   | -10.0 [1] |" in markdown
    assert "[1] no test: 1 paired trial, a paired test needs 2 or more." in markdown


def test_critical_difference_diagram_draws_demsars_ranks():
    from domaingen.inspect.cd_diagram import critical_difference_figure
    from domaingen.inspect.report import FigureSpec, _Figures
    from domaingen.tables.across_datasets import Summary

    result = friedman_nemenyi(DEMSAR)
    spec = FigureSpec(*critical_difference_figure(Summary("Demšar's Table 6", "demsar", pd.DataFrame(), [], result),
                                                  _Figures()))
    assert spec.name == "cd_demsar.png"
    assert list(spec.data["ranks"]) == ["C4.5+m+cf", "C4.5+m", "C4.5+cf", "C4.5"]
    assert spec.data["critical_difference"] == pytest.approx(1.2536, abs=1e-4)
    texts = [t.get_text() for t in spec.figure.axes[0].texts]
    assert "CD = 1.25" in texts and "C4.5+m+cf (1.96)" in texts and "C4.5 (3.14)" in texts
