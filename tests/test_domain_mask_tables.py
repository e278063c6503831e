"""`collect domain-masks`: the tables of `diagnose --domain_masks` from hand-made diagnostics.json, every
number computed again here from the masks themselves."""

from __future__ import annotations

import io
import json
import math
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from domaingen.cli.main import main
from domaingen.inspect.domain_masks import mask_overlap, mask_sharing, seed_stability, weight_ratios
from domaingen.run.rundir import ARGS, DONE, RESULTS

DOMAINS = ["add", "mul"]
# network order, input to output; sorted by name it would be body, classifier, embed
SHAPES = {"embed": (6, 5), "body": (6, 6), "classifier": (3, 6)}
ENVIRONMENTS = ["add", "mul", "add+mul"]


def hand_masks(seed: int) -> list[list[dict[str, torch.Tensor]]]:
    """[mask seed][domain] -> layer -> a random binary mask; mul keeps more than add."""
    g = torch.Generator().manual_seed(seed)
    return [[{n: torch.rand(shape, generator=g) < keep for n, shape in SHAPES.items()} for keep in (0.4, 0.8)]
            for _ in range(3)]


def section(masks: list[list[dict[str, torch.Tensor]]], accuracy: float, layer_order: bool = True) -> dict:
    """A domain_masks section as `diagnose --domain_masks` writes it, from `masks` (first seed: the report's)."""
    first = masks[0]
    layers = {}
    for name, shape in SHAPES.items():
        stacked = torch.stack([m[name].flatten() for m in first])
        layers[name] = {"weights": int(np.prod(shape)), **mask_overlap(stacked), "sharing": mask_sharing(stacked),
                        "kept_weights": [int(v) for v in stacked.sum(1)], "control_kept_fraction": 0.5}
    kept = [sum(int(m[n].sum()) for n in SHAPES) for m in first]
    matrix = [[accuracy, accuracy - 0.5, 0.3], [accuracy - 0.4, accuracy - 0.1, 0.35]]
    inverted = [[0.01, 0.02, 0.03], [0.04, 0.05, 0.06]]
    out = {
        "domains": DOMAINS, "steps": 7, "batch_size": 64, "mask_lr": 0.01, "alpha": 1e-5, "mask_seeds": [0, 1, 2],
        "accuracy": [{"domain": d, "masked": matrix[k][k], "unmasked": 0.99} for k, d in enumerate(DOMAINS)],
        "environments": ENVIRONMENTS, "test_envs": [2], "accuracy_matrix": matrix,
        "inverted_accuracy_matrix": inverted, "unmasked_accuracy": [0.99, 0.99, 0.5],
        "control": {"accuracy": [0.97, 0.96, 0.5], "inverted_accuracy": [0, 0, 0], "kept_fraction": 0.7},
        "sharing": [[1.0, 0.5], [0.25, 1.0]], "kept_weights": kept, "weight_ratio": weight_ratios(kept),
        "layers": layers,
        "seed_stability": seed_stability(DOMAINS, [0, 1, 2], masks, {n: n for n in SHAPES}),
    }
    if layer_order:
        out["layer_order"] = list(SHAPES)
    return out


def write_run(root: Path, name: str, trial: int, diagnostics: dict | None, dataset: str = "AddMul") -> Path:
    """A done run directory of one checkpoint (step 5), with `diagnostics` as its diagnostics.json."""
    path = root / name
    path.mkdir(parents=True)
    args = {"dataset": dataset, "algorithm": "ERM", "test_envs": [2], "hparams_seed": 0, "trial_seed": trial}
    (path / ARGS).write_text(json.dumps(args))
    record = {"step": 5, "args": args, "hparams": {}, "data_source": "hand",
              **{f"env{i}_{s}_acc": 0.5 for i in range(3) for s in ("in", "out")}}
    (path / RESULTS).write_text(json.dumps(record) + "\n")
    (path / DONE).write_text("{}")
    if diagnostics is not None:
        (path / "diagnostics.json").write_text(json.dumps({"step": 5, "checkpoint": "selected", **diagnostics}))
    return path


@pytest.fixture
def sweep(tmp_path) -> tuple[Path, list]:
    root = tmp_path / "sweep"
    masks = [hand_masks(10), hand_masks(20)]
    write_run(root, "run0", 0, {"domain_masks": section(masks[0], 0.9)})
    write_run(root, "run1", 1, {"domain_masks": section(masks[1], 0.8)})
    write_run(root, "run2", 2, None)  # not diagnosed: named under the table
    return root, masks


def collect_out(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert main(["-q", "collect", "domain-masks", *argv]) == 0
    return capsys.readouterr().out


def refused(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert main(["collect", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    return err


def iou(a: list[bool], b: list[bool]) -> float:
    return sum(x and y for x, y in zip(a, b)) / sum(x or y for x, y in zip(a, b))


def flat(mask: dict[str, torch.Tensor], names) -> list[bool]:
    return [bool(v) for n in names for v in mask[n].flatten()]


def domainbed_error(values: list[float]) -> float:
    return float(np.std(np.asarray(values) / math.sqrt(len(values))))


def test_every_number_of_the_tables_computed_from_the_masks(sweep, capsys):
    root, masks = sweep
    table = pd.read_csv(io.StringIO(collect_out(capsys, "--input_dir", str(root), "--format", "csv")))
    summary = table[table["table"] == "summary"].set_index(["row", "column"])
    layers = table[table["table"] == "layers"].set_index(["row", "column"])
    total = sum(np.prod(s) for s in SHAPES.values())
    expected = {}
    for trial, m in enumerate(masks):
        first = m[0]
        kept = [sum(flat(first[d], SHAPES)) for d in range(2)]
        whole = [flat(first[d], SHAPES) for d in range(2)]
        seed_pairs = [iou(flat(m[i][d], SHAPES), flat(m[j][d], SHAPES))
                      for d in range(2) for i, j in combinations(range(3), 2)]
        io_layers, hidden = ["embed", "classifier"], ["body"]
        expected[trial] = {
            f"kept weights, add (% of {total:,})": 100 * kept[0] / total,
            f"kept weights, mul (% of {total:,})": 100 * kept[1] / total,
            "weight ratio mul/add": kept[1] / kept[0],
            "IoU(add, mul), all weights": 100 * iou(*whole),
            "seed IoU, all masks": 100 * np.mean(seed_pairs),
            "seed IoU, add": 100 * np.mean(seed_pairs[:3]),
            "io": 100 * iou(flat(first[0], io_layers), flat(first[1], io_layers)),
            "hidden": 100 * iou(flat(first[0], hidden), flat(first[1], hidden)),
            "embed": 100 * iou(flat(first[0], ["embed"]), flat(first[1], ["embed"])),
            "embed seed": 100 * np.mean([iou(flat(m[i][d], ["embed"]), flat(m[j][d], ["embed"]))
                                         for d in range(2) for i, j in combinations(range(3), 2)]),
        }
    assert total == 84
    for row in ("kept weights, add (% of 84)", "kept weights, mul (% of 84)", "weight ratio mul/add", "IoU(add, mul), all weights",
                "seed IoU, all masks", "seed IoU, add"):
        values = [expected[t][row] for t in (0, 1)]
        for t in (0, 1):
            assert summary.loc[(row, f"trial {t}"), "mean"] == pytest.approx(values[t])
        assert summary.loc[(row, "mean"), "mean"] == pytest.approx(np.mean(values))
        assert summary.loc[(row, "mean"), "error"] == pytest.approx(domainbed_error(values))
        assert summary.loc[(row, "mean"), "n"] == 2
    # accuracies as written, in percent: add's mask inverted, on mul; the control on add
    assert summary.loc[("accuracy on mul, add's mask inverted", "trial 0"), "mean"] == pytest.approx(2.0)
    assert summary.loc[("accuracy on add, mul's mask", "trial 1"), "mean"] == pytest.approx(40.0)
    assert summary.loc[("accuracy on add, control mask", "mean"), "mean"] == pytest.approx(97.0)
    # the paper's numbers beside ours
    assert summary.loc[("weight ratio mul/add", "paper"), "mean"] == pytest.approx(3.8)
    assert summary.loc[("seed IoU, all masks", "paper"), ["mean", "error"]].tolist() == pytest.approx([93.26, 0.96])
    # per layer, in network order (layer_order), the input and output layers pooled against the hidden one
    assert list(layers.index.get_level_values(0).unique()) == ["embed", "body", "classifier",
                                                                "input and output layers", "hidden layers"]
    assert [layers.loc[(n, "role"), "text"] for n in SHAPES] == ["input", "hidden", "output"]
    for row, key in (("input and output layers", "io"), ("hidden layers", "hidden"), ("embed", "embed")):
        values = [expected[t][key] for t in (0, 1)]
        assert layers.loc[(row, "IoU(add, mul)"), "mean"] == pytest.approx(np.mean(values))
        assert layers.loc[(row, "IoU(add, mul)"), "error"] == pytest.approx(domainbed_error(values))
    assert layers.loc[("embed", "seed IoU"), "mean"] == pytest.approx(np.mean([expected[t]["embed seed"] for t in (0, 1)]))
    assert layers.loc[("input and output layers", "paper"), "text"] == "more shared than the hidden layers"


def test_markdown_shows_each_trial_the_mean_and_the_paper(sweep, capsys):
    root, masks = sweep
    out = collect_out(capsys, "--input_dir", str(root))
    assert out.startswith("### AddMul, ERM, test env 2: weight masks per training domain (add, mul)\n")
    header = next(line for line in out.splitlines() if line.startswith("| quantity"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["quantity", "trial 0", "trial 1", "mean", "paper"]
    ratio = next(line for line in out.splitlines() if line.startswith("| weight ratio mul/add"))
    assert ratio.rstrip(" |").endswith("3.8")
    ratios = [sum(flat(m[0][1], SHAPES)) / sum(flat(m[0][0], SHAPES)) for m in masks]
    cells = [c.strip() for c in ratio.strip("|").split("|")]
    assert cells[1:4] == [f"{ratios[0]:.2f}", f"{ratios[1]:.2f}",
                          f"{np.mean(ratios):.2f} ± {domainbed_error(ratios):.2f}"]
    seed_line = next(line for line in out.splitlines() if line.startswith("| seed IoU, all masks"))
    pairs = [iou(flat(masks[0][i][d], SHAPES), flat(masks[0][j][d], SHAPES))
             for d in range(2) for i, j in combinations(range(3), 2)]
    assert f"{100 * np.mean(pairs):.1f} ± {100 * np.std(pairs):.1f}" in seed_line and "93.26 ± 0.96" in seed_line
    assert "trial 0: run run0, masks of step 5, 7 mask steps per mask (batch 64, lr 0.01), alpha 1e-05, " \
           "mask seeds 0 1 2." in out
    assert "Runs without domain masks (run `domaingen diagnose RUN --domain_masks` on them): run2." in out
    assert "#### AddMul, ERM: per layer, input to output" in out
    latex = collect_out(capsys, "--input_dir", str(root), "--format", "latex")
    assert latex.count(r"\begin{tabular}") == 2 and r"93.26 $\pm$ 0.96" in latex


def test_layers_without_their_order_are_sorted_by_name_with_numbers_in_order(tmp_path, capsys):
    from domaingen.tables.domain_mask_tables import layer_order

    assert layer_order({"layers": {"l.10": {}, "l.2": {}, "l.0": {}}}) == ["l.0", "l.2", "l.10"]
    assert layer_order({"layers": {"b": {}, "a": {}}, "layer_order": ["b", "a"]}) == ["b", "a"]
    write_run(tmp_path / "s", "run0", 0, {"domain_masks": section(hand_masks(1), 0.9, layer_order=False)})
    table = pd.read_csv(io.StringIO(collect_out(capsys, "--input_dir", str(tmp_path / "s"), "--format", "csv")))
    roles = table[(table["table"] == "layers") & (table["column"] == "role")]
    assert roles[["row", "text"]].values.tolist()[:3] == [["body", "input"], ["classifier", "hidden"],
                                                          ["embed", "output"]]


def test_a_records_bundle_prints_what_the_sweep_prints(sweep, tmp_path, capsys):
    root, _ = sweep
    bundle = tmp_path / "records.zip"
    assert main(["-q", "export", "--input_dir", str(root), "--output", str(bundle), "--no_weights", "--all_runs"]) == 0
    assert collect_out(capsys, "--input_dir", str(bundle)) == collect_out(capsys, "--input_dir", str(root))


def test_a_sweep_without_domain_masks_is_one_line(tmp_path, capsys):
    write_run(tmp_path / "s", "run0", 0, None)
    err = refused(capsys, "domain-masks", "--input_dir", str(tmp_path / "s"))
    assert err.endswith("no run here has domain masks: run `domaingen diagnose RUN --domain_masks` on its runs first")


def test_runs_of_one_table_with_different_domains_are_one_line(sweep, capsys):
    root, masks = sweep
    other = section(masks[0], 0.9)
    other["domains"] = ["pair1", "pair2"]
    (root / "run1" / "diagnostics.json").write_text(json.dumps({"step": 5, "domain_masks": other}))
    err = refused(capsys, "domain-masks", "--input_dir", str(root))
    assert err.endswith("AddMul ERM: the runs' masks differ in their domains or layers (different set-ups in one "
                        "sweep): collect them apart")


@pytest.mark.parametrize("content, message", [
    ("dataset,quantity,mean,error,claim,source\nAddMul,ratio,3.8,,,x\n",
     "line 2: quantity 'ratio' is not one of weight_ratio, seed_iou, layer_sharing, inverted"),
    ("dataset,quantity,mean,error,claim,source\nAddMul,weight_ratio,,,,x\n",
     "line 2: neither a mean nor a claim; give one of them"),
    ("dataset,quantity,mean,error,claim,source\nAddMul,weight_ratio,x3,,,x\n", "line 2: mean 'x3' is not a number"),
    ("dataset,mean\nAddMul,3\n", "lacks the column(s) quantity, error, claim, source; collect domain-masks reads "
                                 "dataset, quantity, mean, error, claim, source"),
])
def test_a_bad_published_file_is_one_line(sweep, tmp_path, capsys, content, message):
    root, _ = sweep
    path = tmp_path / "paper.csv"
    path.write_text(content)
    assert message in refused(capsys, "domain-masks", "--input_dir", str(root), "--reference", str(path))


def test_the_tables_view_refuses_the_mask_numbers_as_accuracy_rows(sweep, capsys):
    root, _ = sweep
    err = refused(capsys, "--input_dir", str(root), "--reference", "csordas")
    assert err.endswith("reference csordas holds no accuracies: `domaingen collect domain-masks` puts its numbers "
                        "beside ours (--reference takes dmg, domainbed_images, domainbed_mnist, modreg_table1, "
                        "pacs_modern)")


def test_split_by_gives_each_grid_point_its_own_table(tmp_path, capsys):
    """Two runs of one algorithm and trial that differ in a hyperparameter: pooled they would read as two
    trials of one table; --split_by gives each its own, with its own masks' numbers."""
    root = tmp_path / "sweep"
    masks = [hand_masks(10), hand_masks(20)]
    for name, lr, m in (("a", 0.1, masks[0]), ("b", 0.2, masks[1])):
        path = write_run(root, name, 0, {"domain_masks": section(m, 0.9)})
        record = json.loads((path / RESULTS).read_text())
        record["hparams"] = {"lr": lr}
        (path / RESULTS).write_text(json.dumps(record) + "\n")
    table = pd.read_csv(io.StringIO(collect_out(capsys, "--input_dir", str(root), "--format", "csv",
                                                "--split_by", "lr")))
    total = sum(np.prod(s) for s in SHAPES.values())
    row = f"kept weights, add (% of {total:,})"
    kept = table[(table["table"] == "summary") & (table["row"] == row) & (table["column"] == "mean")]
    kept = kept.set_index("algorithm")
    assert sorted(kept.index) == ["ERM (lr=0.1)", "ERM (lr=0.2)"] and set(kept["n"]) == {1}
    for algorithm, m in (("ERM (lr=0.1)", masks[0]), ("ERM (lr=0.2)", masks[1])):
        assert kept.loc[algorithm, "mean"] == pytest.approx(100 * sum(flat(m[0][0], SHAPES)) / total)
