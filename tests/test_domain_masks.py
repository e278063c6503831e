"""Csordás et al.'s tests on per-domain weight masks (`diagnose --domain_masks`), checked by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from domaingen.cli.main import main
from domaingen.errors import DomaingenError
from domaingen.inspect.domain_masks import check_mask_options, mask_sharing


def test_sharing_is_asymmetric_by_hand():
    masks = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    s = np.array(mask_sharing(masks), dtype=float)
    # s(0, 1) = |{0}| / |{0, 1, 2}| = 1/3; s(1, 0) = |{0}| / |{0}| = 1; an empty mask shares nothing defined
    assert s[0, 1] == pytest.approx(1 / 3) and s[1, 0] == 1.0 and s[0, 0] == 1.0
    assert np.isnan(s[2]).all() and s[0, 2] == 0.0


@pytest.mark.parametrize("domains, alpha, message", [
    (1, 1e-5, "--domain_masks compares the masks of the training domains, but this run has 1; use a run that holds "
              "out fewer environments"),
    (2, 0.0, "--mask_alpha must be positive, got 0.0"),
    (2, -1.0, "--mask_alpha must be positive, got -1.0"),
])
def test_mask_options_refused_in_one_line(domains, alpha, message):
    with pytest.raises(DomaingenError) as caught:
        check_mask_options(domains, alpha)
    assert str(caught.value) == message


def train(out, test_envs: str, *extra: str) -> None:
    assert main(["-q", "train", "--dataset", "FeatureContamination", "--algorithm", "ERM", "--test_envs", *test_envs.split(),
                 "--steps", "21", "--checkpoint_freq", "10", "--hparams", '{"mlp_width": 8}', "--output_dir", str(out),
                 *extra]) == 0


def test_one_training_domain_or_a_non_positive_strength_is_exit_2_nothing_written(tmp_path, capsys):
    single = tmp_path / "single"
    train(single, "1 2")
    capsys.readouterr()
    code = main(["-q", "diagnose", str(single), "--domain_masks"])
    assert code == 2 and not (single / "diagnostics.json").exists()
    assert capsys.readouterr().err.strip() == ("domaingen: error: --domain_masks compares the masks of the training "
                                               "domains, but this run has 1; use a run that holds out fewer environments")
    pair = tmp_path / "pair"
    train(pair, "2")
    capsys.readouterr()
    code = main(["-q", "diagnose", str(pair), "--domain_masks", "--mask_alpha", "0"])
    assert code == 2 and not (pair / "diagnostics.json").exists()
    assert capsys.readouterr().err.strip() == "domaingen: error: --mask_alpha must be positive, got 0.0"


def test_masks_that_keep_every_weight_and_their_inversions_by_hand(tmp_path, capsys):
    from domaingen.inspect.diagnose import diagnostic_split
    from domaingen.run.reload import load_run

    run = tmp_path / "run"
    train(run, "2")
    # two mask steps from the positive initial logit: every mask keeps every weight
    assert main(["-q", "diagnose", str(run), "--domain_masks", "--mask_steps", "2", "--max_examples", "60"]) == 0
    assert "control (all)" in capsys.readouterr().out
    masks = json.loads((run / "diagnostics.json").read_text())["domain_masks"]
    loaded = load_run(run)
    splits = [diagnostic_split(loaded, e, 60) for e in range(3)]
    unmasked, bias_only = [], []
    b2 = loaded.algorithm.classifier.bias.detach()
    for split in splits:
        x, y = split.batch(slice(0, len(split)))
        with torch.no_grad():
            unmasked.append(float((loaded.algorithm.predict(x).argmax(1) == y).float().mean()))
        # the inverted mask removes every weight: the logits are the last bias, one class for every example
        bias_only.append(float((y == int(b2.argmax())).float().mean()))
    assert masks["environments"] == ["s=0", "s=0.1", "s=0.2"] and masks["test_envs"] == [2]
    assert masks["unmasked_accuracy"] == pytest.approx(unmasked)
    assert masks["accuracy_matrix"] == [pytest.approx(unmasked)] * 2
    assert masks["inverted_accuracy_matrix"] == [pytest.approx(bias_only)] * 2
    assert masks["control"] == {"accuracy": pytest.approx(unmasked), "inverted_accuracy": pytest.approx(bias_only),
                                "kept_fraction": 1.0}
    assert masks["sharing"] == [[1.0, 1.0], [1.0, 1.0]]
    n_weights = 8 * 256 + 2 * 8
    counts = masks["probability_histogram"]["counts"]
    assert set(counts) == {"s=0", "s=0.1", "control"} and all(sum(c) == n_weights for c in counts.values())
    assert [a["masked"] for a in masks["accuracy"]] == [masks["accuracy_matrix"][0][0], masks["accuracy_matrix"][1][1]]
    assert masks["layers"]["featurizer.hidden"]["sharing"] == [[1.0, 1.0], [1.0, 1.0]]


def domain_mask_diagnostics(control_kept: float = 0.3, control_accuracy=(0.94, 0.9, 0.8)) -> dict:
    return {"max_examples": 500, "domain_masks": {
        "domains": ["a", "b"], "environments": ["a", "b", "c"], "test_envs": [2], "alpha": 1e-3, "steps": 5,
        "accuracy_matrix": [[0.9, 0.5, 0.4], [0.6, 0.8, 0.7]], "inverted_accuracy_matrix": [[0.5, 0.7, 0.6], [0.8, 0.5, 0.5]],
        "unmasked_accuracy": [0.95, 0.9, 0.8],
        "control": {"accuracy": list(control_accuracy), "inverted_accuracy": [0.5, 0.5, 0.5], "kept_fraction": control_kept},
        "sharing": [[1.0, 0.25], [0.5, 1.0]],
        "layers": {"hidden": {"weights": 10, "kept_fraction": [0.5, 0.2]}, "out": {"weights": 30, "kept_fraction": [0.1, 0.0]}},
        "probability_histogram": {"bins": 4, "counts": {"a": [5, 0, 1, 2], "b": [4, 1, 1, 2], "control": [3, 2, 0, 2]}},
    }}


def panels(spec) -> dict:
    """The figure's axes by title (the colorbar's has none)."""
    return {ax.get_title(): ax for ax in spec.figure.axes}


def test_report_draws_the_mask_by_environment_heatmap():
    pytest.importorskip("matplotlib")
    from domaingen.inspect.report import DPI, _pyplot, domain_mask_figures

    [spec] = domain_mask_figures("r", "run", domain_mask_diagnostics(), _pyplot())
    assert spec.data["rows"] == ["mask a", "mask b", "control", "unmasked"]
    assert spec.data["environments"] == ["a", "b", "c*"]
    assert spec.data["accuracy"][3] == [0.95, 0.9, 0.8] and spec.data["inverted_accuracy"][2] == [0.5, 0.5, 0.5]
    axes = panels(spec)
    kept, inverted = axes["accuracy (%) with the mask"], axes["accuracy (%) with the mask inverted (only the weights it removed)"]
    # one 0-100 % scale for the printed cells, one colorbar
    assert np.allclose(kept.images[0].get_array(), [[90, 50, 40], [60, 80, 70], [94, 90, 80], [95, 90, 80]])
    assert [t.get_text() for t in kept.texts[:3]] == ["90", "50", "40"]
    assert all(ax.images[0].get_clim() == (0, 100) for ax in axes.values() if ax.images)
    assert len(spec.figure.axes) == 5 and axes[""].get_ylabel() == "accuracy, s(t, r) (%)"
    # the same rows in the same order, the inverted ones named so; the unmasked network has no inverse
    assert [t.get_text() for t in kept.get_yticklabels()] == [
        "mask a (kept 20.0%)", "mask b (kept 5.0%)", "control (kept 30.0%)", "unmasked"]
    assert [t.get_text() for t in inverted.get_yticklabels()] == ["mask a inverted", "mask b inverted", "control inverted", "unmasked"]
    assert inverted.images[0].get_array().mask[3].all() and [t.get_text() for t in inverted.texts[-3:]] == ["–"] * 3
    assert [t.get_text() for t in kept.get_xticklabels()] == ["a\n(out)", "b\n(out)", "c*\n(in)"]
    assert kept.get_xlabel() == "environment (split it reads; * held out)" and kept.get_ylabel() == "mask trained on"
    # s(t, r) as computed by diagnose
    sharing = axes["s(t, r): share (%) of t's kept weights that r keeps"]
    assert np.allclose(sharing.images[0].get_array(), [[100, 25], [50, 100]])
    # histogram: empty bins draw nothing (no floor), the keep threshold is marked
    histogram = axes["keep probabilities of every masked weight"]
    stairs = {p.get_label(): p for p in histogram.patches}
    assert set(stairs) == {"mask a", "mask b", "control"}
    values, _, _ = stairs["mask a"].get_data()
    assert np.isnan(values[1]) and list(values[[0, 2, 3]]) == [5, 1, 2]
    assert not any(np.isclose(p.get_path().vertices[:, 1], 0.5).any() for p in stairs.values())
    [threshold] = [line for line in histogram.get_lines() if line.get_label() == "keep threshold p = 0.5"]
    assert list(threshold.get_xdata()) == [0.5, 0.5]
    # drawn at the page's width, text of at least 9 pt
    assert spec.figure.get_figwidth() * DPI <= 1100
    assert min(t.get_fontsize() for ax in axes.values() for t in ax.get_yticklabels() + ax.get_xticklabels() + ax.texts) >= 9
    assert "almost nothing" not in spec.caption
    assert domain_mask_figures("r", "run", {"domain_masks": {"layers": {}}}, _pyplot()) == []


def test_report_says_when_the_control_mask_keeps_almost_nothing():
    pytest.importorskip("matplotlib")
    from domaingen.inspect.report import _pyplot, domain_mask_figures

    [spec] = domain_mask_figures("r", "run", domain_mask_diagnostics(6e-6, (0.1, 0.11, 0.13)), _pyplot())
    assert "control (kept 0.0006%)" in [t.get_text() for t in spec.figure.axes[0].get_yticklabels()]
    assert ("the control mask keeps 0.0006% of the weights, almost nothing, and its accuracy (10-13 %) is far "
            "below the unmasked network's (80-95 %): alpha 0.001 is too strong") in spec.caption
