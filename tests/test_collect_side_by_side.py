"""collect over several sweeps side by side (labelled rows), and collect correlations (Spearman by hand)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from domaingen.cli import main
from domaingen.tables.collect import collect
from domaingen.tables.selection import select

SPEC = """
algorithms = ["ERM", "IRM", "VREx"]
datasets = ["ColoredMNIST"]
n_hparams = 1
n_trials = 2
steps = 3
checkpoint_freq = 1

[hparams]
featurizer = "MLP"
mlp_width = {width}
batch_size = 16
"""


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("side")
    out = {}
    for name, width in (("narrow", 8), ("wide", 16)):
        (root / f"{name}.toml").write_text(SPEC.format(width=width))
        assert main(["-q", "sweep", "launch", "--spec", str(root / f"{name}.toml"), "--output_dir", str(root / name),
                     "--data_dir", "embedded", "--launcher", "local", "--no_progress", "--yes"]) == 0
        out[name] = root / name
    return out


def table_rows(text: str) -> dict[str, list[str]]:
    """The first table's rows of collect's Markdown, by their first cell."""
    block = text.split("\n\n")[1]
    rows = [line.strip("|").split("|") for line in block.splitlines()[2:]]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_sweeps_side_by_side_keep_each_ones_cells_under_labelled_rows(sweeps, capsys):
    alone = {}
    for name, path in sweeps.items():
        code, text, _ = run(capsys, "collect", "--input_dir", str(path), "--selection", "training")
        assert code == 0
        alone[name] = table_rows(text)
    code, text, _ = run(capsys, "collect", "--input_dir", f"thin={sweeps['narrow']}", str(sweeps["wide"]),
                        "--selection", "training")
    assert code == 0
    both = table_rows(text)
    assert sorted(both) == sorted([f"{a} (thin)" for a in alone["narrow"]] + [f"{a} (wide)" for a in alone["wide"]])
    for algorithm, cells in alone["narrow"].items():
        assert both[f"{algorithm} (thin)"] == cells
    for algorithm, cells in alone["wide"].items():
        assert both[f"{algorithm} (wide)"] == cells


def test_two_sources_with_one_label_are_refused_in_one_line(sweeps, capsys):
    code, _, err = run(capsys, "collect", "--input_dir", f"x={sweeps['narrow']}", f"x={sweeps['wide']}")
    assert code == 2 and err.strip() == "domaingen: error: --input_dir: two sources are labelled x; name them LABEL=DIR"


def _ranks(values: list[float]) -> list[float]:
    """Average ranks (1-based), ties sharing their mean rank, by a plain loop."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _spearman_by_hand(x: list[float], y: list[float]) -> float:
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


def test_correlations_equal_spearman_by_hand_over_selected_runs_and_algorithm_means(sweeps, capsys):
    code, text, _ = run(capsys, "collect", "correlations", "--input_dir", str(sweeps["wide"]), "--selection",
                        "training", "--fields", "env0_out_acc", "--against", "env1_out_acc", "env2_out_acc",
                        "--format", "csv")
    assert code == 0
    from io import StringIO
    got = pd.read_csv(StringIO(text)).set_index("field")
    records = collect(sweeps["wide"]).records
    picked = select(records, "training")
    indexed = records.drop_duplicates(["run", "step"], keep="last").set_index(["run", "step"])
    points = []
    for row in picked.itertuples():
        record = indexed.loc[(row.run, row.step)]
        points.append((row.algorithm, record["env0_out_acc"], (record["env1_out_acc"] + record["env2_out_acc"]) / 2))
    assert got.loc["env0_out_acc", "runs"] == len(points) == 3 * 3 * 2
    rho = _spearman_by_hand([p[1] for p in points], [p[2] for p in points])
    assert got.loc["env0_out_acc", "runs: rho"] == pytest.approx(rho, abs=1e-3)
    by_algorithm = pd.DataFrame(points, columns=["a", "x", "y"]).groupby("a").mean()
    rho_means = _spearman_by_hand(list(by_algorithm["x"]), list(by_algorithm["y"]))
    assert got.loc["env0_out_acc", "algorithm means: rho"] == pytest.approx(rho_means, abs=1e-3)
    assert list(got["selection"]) == ["training"]


def test_correlations_without_an_unknown_algorithm_is_refused(sweeps, capsys):
    code, _, err = run(capsys, "collect", "correlations", "--input_dir", str(sweeps["wide"]), "--selection",
                       "training", "--fields", "env0_out_acc", "--against", "env1_out_acc", "--without", "CORAL")
    assert code == 2 and err.strip() == ("domaingen: error: --without CORAL: no such algorithm in the tables "
                                         "(ERM, IRM, VREx)")


GRID = """
algorithms = ["ERM", "IRM", "VREx"]
datasets = ["ColoredMNIST"]
n_hparams = 1
n_trials = 2
steps = 3
checkpoint_freq = 1

[[parts]]
[parts.hparams]
featurizer = "MLP"
mlp_width = 8
batch_size = 16

[[parts]]
[parts.hparams]
featurizer = "MLP"
mlp_width = 16
batch_size = 16
"""


def test_split_by_makes_each_grid_point_a_row_equal_to_its_own_sweep(sweeps, tmp_path, capsys):
    (tmp_path / "grid.toml").write_text(GRID)
    assert main(["-q", "sweep", "launch", "--spec", str(tmp_path / "grid.toml"), "--output_dir", str(tmp_path / "g"),
                 "--data_dir", "embedded", "--launcher", "local", "--no_progress", "--yes"]) == 0
    code, text, _ = run(capsys, "collect", "--input_dir", str(tmp_path / "g"), "--selection", "training",
                        "--split_by", "mlp_width")
    assert code == 0
    grid = table_rows(text)
    for name, width in (("narrow", 8), ("wide", 16)):
        _, alone, _ = run(capsys, "collect", "--input_dir", str(sweeps[name]), "--selection", "training")
        for algorithm, cells in table_rows(alone).items():
            assert grid[f"{algorithm} (mlp_width={width})"] == cells
    code, _, err = run(capsys, "collect", "--input_dir", str(tmp_path / "g"), "--split_by", "mlp_widht")
    assert code == 2 and err.startswith("domaingen: error: --split_by mlp_widht: no run has this hyperparameter "
                                        "(they have: ")
