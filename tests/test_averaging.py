"""X+EMA and X+SWAD: the averages against snapshots taken here, SWAD's window by hand, records, resume, refusal."""

from __future__ import annotations

import json

import pytest
import torch

from domaingen.algorithms import ALGORITHMS
from domaingen.algorithms.averaging import LossValley, Segment
from domaingen.cli import main as cli_main
from domaingen.run import training
from domaingen.run.reload import evaluate_run, load_run
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, train
from domaingen.testing import VOLATILE_FIELDS
from imagetree import make_folder_tree

HP = {"lr": 1e-2, "weight_decay": 0.0, "batch_size": 8, "featurizer": "MLP", "mlp_width": 8, "mlp_depth": 3,
      "mlp_dropout": 0.0, "ema_decay": 0.9, "swad_n_converge": 3, "swad_n_tolerance": 6, "swad_tolerance_ratio": 0.3,
      "swad_bn_steps": 1}


def minibatches(step: int):
    g = torch.Generator().manual_seed(step)
    return [(torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(2)]


def params(algorithm) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in algorithm.network.named_parameters()}


@pytest.mark.parametrize("name", ["ERM+EMA", "ERM+SWAD"])
def test_the_average_after_n_steps_is_computed_from_the_n_snapshots(name):
    torch.manual_seed(0)
    algorithm = ALGORITHMS.get(name)((5,), 3, 2, HP)
    snapshots = []
    for step in range(7):
        algorithm.update(minibatches(step))
        snapshots.append(params(algorithm))
    if name == "ERM+SWAD":  # one segment, closed at the end: before convergence SWAD returns it
        algorithm.close_segment(6, 1.0)
        algorithm.finish_averaging(iter([]))
        expected = {k: sum(s[k] for s in snapshots) / len(snapshots) for k in snapshots[0]}
    else:  # EMA: the first snapshot, then decay * avg + (1 - decay) * snapshot
        expected = dict(snapshots[0])
        for s in snapshots[1:]:
            expected = {k: 0.9 * expected[k] + 0.1 * s[k] for k in s}
    algorithm.eval()
    shown = params(algorithm)
    assert all(torch.allclose(shown[k], expected[k], atol=1e-6) for k in expected)
    algorithm.train()  # training goes on from the live weights
    assert all(torch.equal(v, snapshots[-1][k]) for k, v in params(algorithm).items())
    # a state dict always holds the live weights in their slots, whatever the mode
    algorithm.eval()
    assert torch.equal(algorithm.state_dict()["network.1.weight"], snapshots[-1]["1.weight"])


def valley_of(losses, n_converge=3, n_tolerance=6, ratio=0.3):
    valley = LossValley(n_converge, n_tolerance, ratio)
    for i, loss in enumerate(losses):
        valley.add(Segment(start=100 * i + 1, end=100 * (i + 1), loss=loss, weights=float(i)))
    return valley


def test_swad_window_on_a_valley_that_dies_matches_a_hand_computation():
    losses = [1.0, 0.8, 0.6, 0.5, 0.55, 0.52, 0.58, 0.9, 1.2, 1.5, 1.6, 1.7, 1.8]
    valley = valley_of(losses)
    # by hand: segments 3, 4, 5 are the first three whose first is their minimum -> converged at s3's end (400);
    # threshold = 1.3 x mean(0.5, 0.55, 0.52); looking back over s0..s3, s1 (0.8) is above it, so the window
    # reaches back to s2 and SWAD's code adds s3 (back[start + 1:]). Then each segment joins once it is the oldest
    # of six whose least loss is within the threshold: s3 (again: SWAD's double count), s4, s5, s6; with s7..s12
    # (least 0.9) the valley dies.
    threshold = 1.3 * (0.5 + 0.55 + 0.52) / 3
    assert valley.threshold == pytest.approx(threshold) and valley.converge_step == 400 and valley.dead
    final = valley.finish()
    assert [start // 100 for start, _ in valley.used] == [3, 3, 4, 5, 6]
    assert final.weights == pytest.approx((3 + 3 + 4 + 5 + 6) / 5)
    assert (final.start, final.end) == (301, 700)


def test_swad_window_when_training_ends_inside_the_valley_matches_a_hand_computation():
    losses = [1.0, 0.9, 0.8, 0.7, 0.75, 0.72, 0.71, 0.74]
    valley = valley_of(losses)
    # converged at s3 (0.7 the least of 0.7, 0.75, 0.72); threshold 1.3 x 0.72333 = 0.9403: looking back, s0 (1.0)
    # is above it, so s2 and s3 join; s6 and s7 arrive while the oldest of the queue is before s3. At the end the
    # queue after its first (s3..s7) joins while its least loss stays within the threshold: all of it.
    assert not valley.dead
    final = valley.finish()
    assert [start // 100 for start, _ in valley.used] == [2, 3, 3, 4, 5, 6, 7]
    assert final.weights == pytest.approx((2 + 3 + 3 + 4 + 5 + 6 + 7) / 7)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    make_folder_tree(root / "PACS", ["art_painting", "cartoon", "photo", "sketch"], ["dog", "horse"], per_class=5)
    return root


SMALL = {"featurizer": "MNIST_CNN", "image_size": 16, "batch_size": 2, "num_workers": 0, "swad_bn_steps": 2,
         "swad_n_converge": 1, "swad_n_tolerance": 1}


def config(out, data_dir, algorithm="ERM+SWAD", **kw) -> TrainConfig:
    hparams = {k: v for k, v in SMALL.items() if "SWAD" in algorithm or not k.startswith("swad_")}
    base = dict(dataset="PACS", algorithm=algorithm, output_dir=str(out), test_envs=[3], data_dir=str(data_dir),
                hparams=hparams, steps=5, checkpoint_freq=2)
    base.update(kw)
    return TrainConfig(**base)


def test_swad_records_say_which_weights_and_selection_reloads_the_average(data_dir, tmp_path):
    records = train(config(tmp_path / "run", data_dir)).records
    assert [r["weights_evaluated"] for r in records[:-1]] == ["live"] * (len(records) - 1)
    assert records[-1]["weights_evaluated"].startswith("SWAD average of steps")
    assert "env0_out_acc" not in records[0] and "live_env0_out_acc" in records[0]
    assert all(isinstance(r["swad_val_loss"], float) for r in records)
    loaded = load_run(tmp_path / "run")  # selected.pt: the only record with accuracies, the average
    assert loaded.step == 4
    again = evaluate_run(loaded)
    fields = [f"{split}_acc" for split in records[-1]["evaluated"]]
    assert fields and {k: again[k] for k in fields} == pytest.approx({k: records[-1][k] for k in fields})


@pytest.mark.parametrize("algorithm", ["ERM+SWAD", "ERM+EMA"])
def test_resume_restores_the_average_exactly(data_dir, tmp_path, monkeypatch, algorithm):
    straight = train(config(tmp_path / "straight", data_dir, algorithm)).records
    calls = {"n": 0}
    real = training.evaluate

    def evaluate_then_die(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # during the checkpoint at step 4, after those at 0 and 2
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "evaluate", evaluate_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(config(tmp_path / "resumed", data_dir, algorithm))
    monkeypatch.setattr(training, "evaluate", real)
    resumed = train(config(tmp_path / "resumed", data_dir, algorithm)).records
    drop = VOLATILE_FIELDS
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed] == \
        [{k: v for k, v in r.items() if k not in drop} for r in straight]
    a = torch.load(tmp_path / "straight" / "selected.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "resumed" / "selected.pt", weights_only=False)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.startswith("weight_average.") for k in a)


def test_swad_without_training_domain_validation_is_refused_in_one_line(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code = cli_main(["train", "--dataset", "PACS", "--algorithm", "ERM+SWAD", "--test_envs", "3", "--data_dir",
                     str(data_dir), "--output_dir", str(out), "--holdout_fraction", "0", "--hparams", json.dumps(SMALL)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not out.exists() and len(err.splitlines()) == 1
    assert "training-domain validation loss" in err and "holdout_fraction" in err


def test_averaging_composes_with_modreg_and_keeps_the_base_seed():
    cls = ALGORITHMS.get("ERM+ModReg+SWAD")
    assert ALGORITHMS.base_name("ERM+ModReg+SWAD") == "ERM"
    assert training.run_seed("PACS", "ERM+SWAD", [3], 0, 0) == training.run_seed("PACS", "ERM", [3], 0, 0)
    torch.manual_seed(0)
    algorithm = cls((5,), 3, 2, {**HP, "modreg_alpha": 1e-6, "modreg_beta": 1e-4, "modreg_groups": 2,
                                 "modreg_mask_lr": 1e-2, "modreg_init_logit": 2.0, "modreg_mask_bias": False,
                                 "modreg_scale": 1.0, "modreg_pi": "sigmoid", "modreg_rescaled": True})
    logits = []
    for step in range(3):
        algorithm.update(minibatches(step))
        logits.append({k: v.detach().clone() for k, v in algorithm.named_parameters() if "mask_logits" in k})
    algorithm.close_segment(2, 1.0)
    algorithm.finish_averaging(iter([]))
    algorithm.eval()
    for k, v in algorithm.named_parameters():
        if "mask_logits" in k:  # the masks are averaged as logits
            assert torch.allclose(v, sum(s[k] for s in logits) / 3, atol=1e-6)
