"""collect --paired_over draws: differences paired by (hparams_seed, trial_seed), each run at its own selected checkpoint."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from domaingen.cli.main import main
from domaingen.run.rundir import to_json

ALGORITHMS = ("ERM", "ERM+ModReg")
HELD_OUT = (0, 1)
STEPS = (0, 1, 2)
# (algorithm, hparams_seed, trial_seed) of every run; ERM+ModReg's draw 3 has no ERM partner
RUNS = [(a, h, t) for a in ALGORITHMS for h in range(3) for t in range(2)] + [("ERM+ModReg", 3, 0)]


def accuracies(seed: int = 0) -> dict[tuple, np.ndarray]:
    """Per run (algorithm, hparams_seed, trial_seed, test_env): in and out accuracies of the 3
    environments at each step, shape (steps, 2, 3); continuous draws: no ties in selection or in the test."""
    rng = np.random.default_rng(seed)
    acc = {(a, h, t, e): rng.uniform(0.2, 0.65, (len(STEPS), 2, 3)) for a, h, t in RUNS for e in HELD_OUT}
    for (a, _, _, e), grid in acc.items():
        if a == "ERM+ModReg" and e == 0:  # better on the held-out env 0: a small p there
            grid[:, 0, 0] += 0.3
    return acc


def write_sweep(root, acc: dict[tuple, np.ndarray], protocol: str | None = None) -> None:
    for (a, h, t, e), grid in acc.items():
        run = root / f"{a}_h{h}_t{t}_e{e}"
        run.mkdir(parents=True)
        args = {"dataset": "ColoredMNIST", "algorithm": a, "test_envs": [e], "hparams_seed": h, "trial_seed": t,
                "output_dir": str(run), **({"protocol": protocol} if protocol else {})}
        lines = []
        for step in STEPS:
            accs = {f"env{i}_{split}_acc": float(grid[step, s, i]) for s, split in enumerate(("in", "out")) for i in range(3)}
            lines.append(to_json({**accs, "step": step, "args": args, "hparams": {}, "data_source": "MNIST-70000"}))
        (run / "results.jsonl").write_text("\n".join(lines) + "\n")
        (run / "args.json").write_text(json.dumps(args))
        (run / "done").write_text("{}")


def by_hand(acc: dict[tuple, np.ndarray], method: str, env: int) -> tuple[list[float], list[tuple[int, int]]]:
    """A − B per (hparams_seed, trial_seed) both have, each run's test accuracy (its test env's in
    split) at the step `method` picks in it: the best mean out accuracy of the training envs
    (training), or the last step (oracle)."""
    def selected(a, h, t):
        grid = acc[(a, h, t, env)]
        others = [i for i in range(3) if i != env]
        step = int(np.argmax([np.mean(grid[s, 1, others]) for s in STEPS])) if method == "training" else STEPS[-1]
        return grid[step, 0, env]

    keys = sorted({(h, t) for a, h, t in RUNS if a == "ERM+ModReg"} & {(h, t) for a, h, t in RUNS if a == "ERM"})
    return [selected("ERM+ModReg", h, t) - selected("ERM", h, t) for h, t in keys], keys


def collect_csv(capsys, root, *flags) -> pd.DataFrame:
    assert main(["-q", "collect", "--input_dir", str(root), "--paired", "--format", "csv", *flags]) == 0
    return pd.read_csv(io.StringIO(capsys.readouterr().out))


@pytest.mark.parametrize("method", ["training", "oracle"])
def test_draw_pairs_match_a_hand_computed_wilcoxon_with_holm(tmp_path, capsys, method):
    acc = accuracies()
    write_sweep(tmp_path / "s", acc)
    csv = collect_csv(capsys, tmp_path / "s", "--selection", method, "--paired_over", "draws")
    paired = csv[csv["table"] == "paired"].reset_index(drop=True)
    assert paired["algorithm"].tolist() == ["ERM+ModReg − ERM"] * 2 and paired["column"].tolist() == ["+90%", "+80%"]
    p_values = []
    for env, row in zip(HELD_OUT, paired.itertuples()):
        diffs, keys = by_hand(acc, method, env)
        assert len(diffs) == 6  # three draws by two trials; draw 3 is unpaired
        assert [float(v) for v in row.values.split(";")] == pytest.approx(diffs, abs=1e-12)
        assert row.mean == pytest.approx(np.mean(diffs))
        assert row.hparams_seeds == ";".join(str(h) for h, _ in keys)
        assert row.trial_seeds == ";".join(str(t) for _, t in keys)
        assert row.note.endswith("; 1 unpaired run(s) left out")
        expected = stats.wilcoxon(diffs, method="exact").pvalue
        assert row.test == "wilcoxon" and row.p_value == pytest.approx(expected)
        p_values.append(expected)
    # Holm over the table's two tests: the smaller p doubled, the larger no smaller than it
    low, high = sorted(p_values)
    holm = {low: min(1, 2 * low), high: max(min(1, 2 * low), high)}
    assert paired["p_holm"].tolist() == pytest.approx([holm[p] for p in p_values])


def test_draw_pairs_caption_and_trials_unchanged(tmp_path, capsys):
    write_sweep(tmp_path / "s", accuracies())
    flags = ["-q", "collect", "--input_dir", str(tmp_path / "s"), "--selection", "training", "--paired"]
    assert main(flags + ["--paired_over", "draws"]) == 0
    drawn = capsys.readouterr().out
    assert ("ColoredMNIST: paired differences of test accuracy, paired over hyperparameter draws and trials "
            "(same hparams_seed and trial_seed), training-domain validation; p: two-sided paired test of the "
            "pairs' differences, Holm-adjusted over the table's 2 tests") in drawn
    assert main(flags) == 0
    default = capsys.readouterr().out
    assert main(flags + ["--paired_over", "trials"]) == 0
    assert capsys.readouterr().out == default
    assert "paired differences of test accuracy (same trial_seed), training-domain validation" in default
    assert "hyperparameter draws" not in default


def test_draw_pairs_are_refused_in_one_line(tmp_path, capsys):
    write_sweep(tmp_path / "db", accuracies(), protocol="domainbed")
    assert main(["collect", "--input_dir", str(tmp_path / "db"), "--paired", "--paired_over", "draws"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "domaingen: error: --paired_over draws: under protocol domainbed every trial draws its own "
        "hyperparameters, so draws do not pair; use --paired_over trials")
    # trials still pair under domainbed
    assert main(["-q", "collect", "--input_dir", str(tmp_path / "db"), "--paired"]) == 0
    assert "(same trial_seed)" in capsys.readouterr().out
    write_sweep(tmp_path / "s", accuracies())
    assert main(["collect", "--input_dir", str(tmp_path / "s"), "--paired_over", "draws"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "--paired_over draws says what --paired or --baseline pairs; add one of them")


def test_draw_paired_cell_pairs_by_both_seeds():
    from domaingen.tables.comparisons import paired_cell
    from domaingen.tables.reporting import Cell

    def cell(values, keys):
        return Cell(values, trace=[{"hparams_seed": h, "trial_seed": t, "step": 1, "run": f"r{h}{t}"} for h, t in keys])

    a = cell([0.5, 0.7], [(0, 0), (1, 0)])
    one = paired_cell(a, cell([0.4, 0.9], [(0, 0), (0, 1)]), test=True, over="draws")
    assert one.values == pytest.approx([0.1]) and one.trace[0]["hparams_seed"] == 0
    assert one.note == "lower in 0 of 1 pairs, higher in 1; 2 unpaired run(s) left out"
    assert one.footnote == "no test: 1 pair, a paired test needs 2 or more"
    none = paired_cell(a, cell([0.4], [(2, 0)]), test=True, over="draws")
    assert none.missing == "no (hparams_seed, trial_seed) in common"
