"""Test-time adapters: each one's adaptation computed another way on a tiny model, the protocol, the errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import FAST_HPARAMS
from domaingen.adapt import ADAPTERS, adapt_run, adapted_file, register_adapter
from domaingen.adapt.base import Adapter, confident_cross_entropy, grid_points, information_maximization
from domaingen.adapt.run import no_single_batches
from domaingen.algorithms.base import Algorithm
from domaingen.errors import DomaingenError
from domaingen.registry import NameClashError, UnknownNameError

TRAIN_HPARAMS = {"lr": 0.01, "weight_decay": 0.0}


class Tiny(Algorithm):
    """A featurizer (Linear, BatchNorm1d or not, ReLU) and a linear classifier."""

    def __init__(self, batch_norm: bool = True, n_in: int = 5, width: int = 4, classes: int = 3) -> None:
        super().__init__((n_in,), classes, 2, TRAIN_HPARAMS)
        layers = [nn.Linear(n_in, width)] + ([nn.BatchNorm1d(width)] if batch_norm else []) + [nn.ReLU()]
        self.featurizer = nn.Sequential(*layers)
        self.classifier = nn.Linear(width, classes)

    def predict(self, x, domain=None):
        return self.classifier(self.featurizer(x))


def tiny(batch_norm: bool = True, seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    model = Tiny(batch_norm)
    if batch_norm:  # running statistics that batch statistics must replace
        model.featurizer[1].running_mean.fill_(3.0)
        model.featurizer[1].running_var.fill_(9.0)
    return model.eval()


def batches(n: int = 3, size: int = 8, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(size, 5, generator=g) * 2 for _ in range(n)]


def entropy(logits: torch.Tensor) -> torch.Tensor:
    p = torch.softmax(logits, 1)
    return -(p * torch.log(p)).sum(1)


def adam_first_step(p: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
    # Adam's first step from zero moments: m_hat = g, v_hat = g^2, so p - lr * g / (|g| + eps)
    return p - lr * grad / (grad.abs() + 1e-8)


def test_the_registry_holds_the_forks_nine_adapters_with_its_grids():
    assert ADAPTERS.names() == ["T3A", "TentFull", "TentNorm", "TentPreBN", "TentClf", "PseudoLabel", "PLClf",
                                "SHOT", "SHOTIM"]
    assert [p["filter_K"] for p in grid_points(ADAPTERS.get("T3A").GRID)] == [1, 5, 20, 50, 100, -1]
    assert grid_points(ADAPTERS.get("TentFull").GRID) == [{"alpha": a, "gamma": g} for a in (0.1, 1.0, 10.0)
                                                           for g in (1, 3)]
    assert len(grid_points(ADAPTERS.get("SHOT").GRID)) == 6 and grid_points(ADAPTERS.get("TentNorm").GRID) == [{}]


def test_a_plugin_registers_an_adapter_and_a_clash_is_refused():
    @register_adapter("Identity")
    class Identity(Adapter):
        def adapt(self, batch):
            return batch

    try:
        assert ADAPTERS.get("identity") is Identity
        with pytest.raises(NameClashError, match="adapter 'Identity' is registered twice"):
            @register_adapter("Identity")
            class Other(Adapter):
                pass
    finally:
        ADAPTERS.unregister("Identity")


def test_an_unknown_adapter_lists_the_valid_ones():
    with pytest.raises(UnknownNameError) as info:
        ADAPTERS.get("T3B")
    message = str(info.value)
    assert "unknown adapter 'T3B'" in message and "did you mean 'T3A'" in message and "SHOTIM" in message
    assert "\n" not in message


def hand_t3a(model: Tiny, xs: list[torch.Tensor], k: int) -> list[torch.Tensor]:
    """T3A by a loop over python lists: supports as (feature, class, entropy) triples."""
    w = model.classifier.weight.detach()
    with torch.no_grad():
        start = model.classifier(w)
        supports = [(w[c], int(start[c].argmax()), float(entropy(start[c:c + 1]))) for c in range(len(w))]
        out = []
        for x in xs:
            z = model.featurizer(x)
            logits = model.classifier(z)
            supports += [(z[i], int(logits[i].argmax()), float(entropy(logits[i:i + 1]))) for i in range(len(z))]
            kept = []
            for c in range(3):
                mine = sorted((s for s in supports if s[1] == c), key=lambda s: s[2])
                kept += mine[:k]  # k = -1 drops the class's most uncertain support, as the fork's slice does
            supports = kept
            prototypes = torch.zeros(3, z.shape[1])
            for feature, c, _ in supports:
                prototypes[c] += feature / max(feature.norm(), 1e-12)
            prototypes = torch.stack([p / max(p.norm(), 1e-12) for p in prototypes])
            out.append(z @ prototypes.T)
    return out


@pytest.mark.parametrize("k", [1, 5, -1])
def test_t3a_equals_prototypes_of_the_lowest_entropy_supports_by_hand(k):
    model, xs = tiny(batch_norm=False), batches(n=4)
    adapter = ADAPTERS.get("T3A")(model, {"filter_K": k}, TRAIN_HPARAMS)
    got = [adapter.adapt(model.featurizer(x).detach()) for x in xs]
    for mine, theirs in zip(got, hand_t3a(model, xs, k)):
        torch.testing.assert_close(mine, theirs)
    assert adapter.classifier is model.classifier and len(adapter.supports) <= (3 * k if k > 0 else 99)


def batch_normalized(model: Tiny, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    h = model.featurizer[0](x)
    h = (h - h.mean(0)) / torch.sqrt(h.var(0, unbiased=False) + 1e-5) * weight + bias
    return model.classifier(torch.relu(h))


def test_tent_full_predicts_with_batch_statistics_then_takes_an_entropy_step_on_batchnorm_affine():
    model, (x1, x2) = tiny(), batches(n=2)
    bn = model.featurizer[1]
    weight, bias = bn.weight.detach().clone().requires_grad_(), bn.bias.detach().clone().requires_grad_()
    adapter = ADAPTERS.get("TentFull")(model, {"alpha": 10.0, "gamma": 1}, TRAIN_HPARAMS)
    logits = batch_normalized(model, x1, weight, bias)
    g_weight, g_bias = torch.autograd.grad(entropy(logits).mean(), [weight, bias])
    torch.testing.assert_close(adapter.adapt(x1), logits.detach())
    lr = 0.01 * 10.0
    stepped_w, stepped_b = adam_first_step(weight, g_weight, lr), adam_first_step(bias, g_bias, lr)
    adapted_bn = adapter.model.featurizer[1]
    torch.testing.assert_close(adapted_bn.weight.detach(), stepped_w.detach())
    torch.testing.assert_close(adapted_bn.bias.detach(), stepped_b.detach())
    # the second batch is predicted by the stepped affine parameters; nothing else moved, the model is untouched
    torch.testing.assert_close(adapter.adapt(x2), batch_normalized(model, x2, stepped_w, stepped_b).detach(),
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(adapter.model.classifier.weight, model.classifier.weight)
    assert model.featurizer[1].running_mean[0] == 3.0 and bool((model.featurizer[1].weight == bn.weight).all())


def test_tent_norm_normalizes_with_batch_statistics_and_never_steps():
    model, (x1, x2) = tiny(), batches(n=2)
    bn = model.featurizer[1]
    adapter = ADAPTERS.get("TentNorm")(model, {}, TRAIN_HPARAMS)
    for x in (x1, x2):
        torch.testing.assert_close(adapter.adapt(x), batch_normalized(model, x, bn.weight, bn.bias).detach())


def test_tent_prebn_normalizes_features_before_the_classifier_and_steps_only_that_batchnorm():
    model, (x1,) = tiny(batch_norm=False), batches(n=1)
    z = model.featurizer(x1).detach()
    adapter = ADAPTERS.get("TentPreBN")(model, {"alpha": 1.0, "gamma": 1}, TRAIN_HPARAMS)
    weight, bias = torch.ones(4, requires_grad=True), torch.zeros(4, requires_grad=True)
    normalized = (z - z.mean(0)) / torch.sqrt(z.var(0, unbiased=False) + 1e-5) * weight + bias
    logits = model.classifier(normalized)
    g_weight, g_bias = torch.autograd.grad(entropy(logits).mean(), [weight, bias])
    torch.testing.assert_close(adapter.adapt(z), logits.detach())
    bn = adapter.model.classifier.bn
    torch.testing.assert_close(bn.weight.detach(), adam_first_step(weight, g_weight, 0.01).detach())
    torch.testing.assert_close(bn.bias.detach(), adam_first_step(bias, g_bias, 0.01).detach())
    torch.testing.assert_close(adapter.model.classifier.classifier.weight, model.classifier.weight)


def test_tent_clf_steps_the_classifier_on_entropy_gamma_times():
    model, (x1,) = tiny(batch_norm=False), batches(n=1)
    z = model.featurizer(x1).detach()
    w, b = model.classifier.weight.detach().clone(), model.classifier.bias.detach().clone()
    adapter = ADAPTERS.get("TentClf")(model, {"alpha": 0.1, "gamma": 3}, TRAIN_HPARAMS)
    opt_w, opt_b = w.clone().requires_grad_(), b.clone().requires_grad_()
    opt = torch.optim.Adam([opt_w, opt_b], lr=0.001)
    for _ in range(3):  # the returned logits are the last forward's, before the last step
        opt.zero_grad()
        last = z @ opt_w.T + opt_b
        entropy(last).mean().backward()
        opt.step()
    torch.testing.assert_close(adapter.adapt(z), last.detach())
    torch.testing.assert_close(adapter.model.classifier.weight.detach(), opt_w.detach())


def test_information_maximization_and_confident_cross_entropy_by_formula():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.1, 0.2, 0.3], [-3.0, 4.0, 0.0]])
    p = torch.softmax(logits, 1).tolist()
    mean = [sum(row[c] for row in p) / 3 for c in range(3)]
    per_row = sum(-sum(q * math.log(q) for q in row) for row in p) / 3
    expected = per_row + sum(m * math.log(m + 1e-5) for m in mean)
    assert information_maximization(logits).item() == pytest.approx(expected, rel=1e-6)
    # rows 0 and 2 are confident above 0.8 (row 1 is not): the mean of -log p of their argmax
    confident = [-math.log(max(p[0])), -math.log(max(p[2]))]
    assert confident_cross_entropy(logits, 0.8).item() == pytest.approx(sum(confident) / 2, rel=1e-6)
    assert confident_cross_entropy(logits, 0.9999).item() == 0.0


def test_shot_steps_the_featurizer_on_im_plus_theta_pseudo_labels_and_keeps_the_classifier():
    model, (x1,) = tiny(batch_norm=False), batches(n=1)
    hparams = {"alpha": 1.0, "gamma": 1, "beta": 0.5, "theta": 0.1}
    adapter = ADAPTERS.get("SHOT")(model, hparams, TRAIN_HPARAMS)
    params = [p.detach().clone().requires_grad_() for p in model.featurizer.parameters()]
    logits = model.classifier(torch.relu(x1 @ params[0].T + params[1]))
    loss = information_maximization(logits) + 0.1 * confident_cross_entropy(logits, 0.5)
    grads = torch.autograd.grad(loss, params)
    torch.testing.assert_close(adapter.adapt(x1), logits.detach())
    for mine, p, g in zip(adapter.model.featurizer.parameters(), params, grads):
        torch.testing.assert_close(mine.detach(), adam_first_step(p, g, 0.01).detach())
    torch.testing.assert_close(adapter.model.classifier.weight, model.classifier.weight)


def test_shotim_and_pseudo_label_losses():
    model, (x1,) = tiny(batch_norm=False), batches(n=1)
    logits = model.predict(x1)
    shotim = ADAPTERS.get("SHOTIM")(model, {"alpha": 1.0, "gamma": 1, "beta": 0.9, "theta": 0.1}, TRAIN_HPARAMS)
    assert shotim.loss(logits).item() == pytest.approx(information_maximization(logits).item())
    # no prediction is confident above 0.9999: PseudoLabel's step has zero gradients and (no weight decay) moves nothing
    adapter = ADAPTERS.get("PseudoLabel")(model, {"alpha": 1.0, "gamma": 3, "beta": 0.9999}, TRAIN_HPARAMS)
    torch.testing.assert_close(adapter.adapt(x1), logits.detach())
    for mine, theirs in zip(adapter.model.parameters(), model.parameters()):
        torch.testing.assert_close(mine, theirs)


def test_plclf_steps_only_the_classifier_on_confident_pseudo_labels():
    model, (x1,) = tiny(batch_norm=False), batches(n=1)
    z = model.featurizer(x1).detach()
    adapter = ADAPTERS.get("PLClf")(model, {"alpha": 1.0, "gamma": 1, "beta": 0.4}, TRAIN_HPARAMS)
    w, b = model.classifier.weight.detach().clone().requires_grad_(), model.classifier.bias.detach().clone().requires_grad_()
    logits = z @ w.T + b
    g_w, g_b = torch.autograd.grad(confident_cross_entropy(logits, 0.4), [w, b])
    torch.testing.assert_close(adapter.adapt(z), logits.detach())
    torch.testing.assert_close(adapter.model.classifier.weight.detach(), adam_first_step(w, g_w, 0.01).detach())


def test_an_adapter_of_batchnorm_refuses_a_featurizer_without_it():
    for name in ("TentFull", "TentNorm"):
        with pytest.raises(DomaingenError) as info:
            ADAPTERS.get(name)(tiny(batch_norm=False), {"alpha": 1.0, "gamma": 1}, TRAIN_HPARAMS)
        assert str(info.value) == (f"{name} adapts the featurizer's BatchNorm layers and Sequential has none; adapt "
                                   "a run with a BatchNorm featurizer (a ResNet), or use TentPreBN, which adds its own")
    ADAPTERS.get("TentPreBN")(tiny(batch_norm=False), {"alpha": 1.0, "gamma": 1}, TRAIN_HPARAMS)  # adds its own


def test_a_last_batch_of_one_joins_the_one_before():
    data = [(torch.zeros(n, 2), torch.zeros(n)) for n in (32, 32, 1)]
    assert [len(y) for _, y in no_single_batches(data)] == [32, 33]
    assert [len(y) for _, y in no_single_batches(data[:2])] == [32, 32]


# --- a trained run, adapted ---

def train_run(path: Path, algorithm: str = "ERM", hparams_seed: int = 0) -> Path:
    from domaingen.cli.main import main

    hparams = {**FAST_HPARAMS, "lr": 3e-3}
    code = main(["-q", "train", "--dataset", "ColoredMNIST", "--algorithm", algorithm, "--test_envs", "2",
                 "--data_dir", "embedded", "--steps", "5", "--checkpoint_freq", "2", "--hparams_seed",
                 str(hparams_seed), "--hparams", json.dumps(hparams), "--output_dir", str(path)])
    assert code == 0
    return path


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tta_sweep")
    for seed in (0, 1):
        train_run(root / f"erm{seed}", hparams_seed=seed)
    return root


def test_adapt_run_stores_each_grid_point_and_skips_what_is_stored(sweep):
    from domaingen.adapt.run import adapted_accuracy, feature_batches
    from domaingen.run.reload import load_run

    run = sweep / "erm0"
    assert adapt_run(run, ["T3A"]) == {"T3A": "done"}
    lines = [json.loads(line) for line in adapted_file(run, "T3A").read_text().splitlines()]
    assert [r["adapt_hparams"]["filter_K"] for r in lines] == [1, 5, 20, 50, 100, -1]
    loaded = load_run(run)
    test_in = loaded.splits[2][0]
    feats = feature_batches(loaded.algorithm, loaded.dataset.eval_batches(test_in, 32), loaded.device)
    t3a = ADAPTERS.get("T3A")(loaded.algorithm, {"filter_K": 20}, loaded.hparams)
    assert lines[2]["env2_in_acc"] == adapted_accuracy(t3a, feats, loaded.device)
    assert set(lines[0]) >= {"env0_out_acc", "env1_out_acc", "env2_out_acc", "env2_in_acc"}
    assert "env0_in_acc" not in lines[0]
    before = adapted_file(run, "T3A").read_bytes()
    assert adapt_run(run, ["T3A"]) == {"T3A": "stored already"}
    assert adapted_file(run, "T3A").read_bytes() == before


def test_adapting_a_run_without_selected_weights_names_the_run(sweep, tmp_path):
    import shutil

    run = tmp_path / "old_run"
    shutil.copytree(sweep / "erm1", run)
    (run / "selected.pt").unlink()
    with pytest.raises(DomaingenError) as info:
        adapt_run(run, ["TentClf"])
    assert str(info.value) == (f"run {run} has no selected weights (selected.pt) to adapt: it was trained before runs "
                               "kept them, or has no validation split; retrain it to adapt it")


# --- the command and the tables ---

def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    from domaingen.cli.main import main

    code = main(["-q", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_bad_adapters_exit_2_with_one_line(sweep, capsys):
    code, _, err = run_cli(capsys, "adapt", "--input_dir", str(sweep), "--adapters", "T3B")
    assert code == 2 and err.count("\n") == 1
    assert "unknown adapter 'T3B' in --adapters; did you mean 'T3A'? valid adapters: T3A, TentFull" in err
    code, _, err = run_cli(capsys, "adapt", "--input_dir", str(sweep), "--adapters", "TentNorm")
    assert code == 2 and err == ("domaingen: error: TentNorm adapts the featurizer's BatchNorm layers and MLP has none; "
                                 "adapt a run with a BatchNorm featurizer (a ResNet), or use TentPreBN, which adds its own\n")
    assert not any(sweep.glob("*/adapted_TentNorm.jsonl"))


def expected_cell(sweep: Path, adapter: str, val_fields: list[str]) -> float:
    """The test accuracy (env2 in) of the (draw, grid point) with the best mean of `val_fields`; ties: the
    largest encoded hparams_seed (draw * grid size + index), as DomainBed's per-trial rule breaks them."""
    best = None
    for seed in (0, 1):
        for r in map(json.loads, adapted_file(sweep / f"erm{seed}", adapter).read_text().splitlines()):
            key = (sum(r[f] for f in val_fields) / len(val_fields), seed * r["grid_size"] + r["grid_index"])
            if best is None or key > best[0]:
                best = (key, r["env2_in_acc"])
    return best[1]


def test_collect_shows_adapted_rows_selected_by_each_rule(sweep, capsys):
    code, out, _ = run_cli(capsys, "adapt", "--input_dir", str(sweep))
    assert code == 0
    outcomes = {line.split()[0]: " ".join(line.split()[1:-1]) for line in out.splitlines()[3:-1]}
    assert outcomes["TentFull"].startswith("undefined: TentFull adapts the featurizer's BatchNorm layers and MLP has none")
    assert outcomes["T3A"] == "stored already" and outcomes["SHOT"] == "done"
    code, out, _ = run_cli(capsys, "collect", "--input_dir", str(sweep), "--format", "csv")
    assert code == 0
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(out)))
    cells = {(r["selection"], r["table"], r["algorithm"]): float(r["mean"]) for r in rows if r["column"] == "-90%"}
    for adapter in ("T3A", "TentPreBN", "SHOT"):
        training = expected_cell(sweep, adapter, ["env0_out_acc", "env1_out_acc"])
        oracle = expected_cell(sweep, adapter, ["env2_out_acc"])
        assert cells[("training", "test", f"ERM+{adapter}")] == pytest.approx(training, abs=1e-12)
        assert cells[("oracle", "test", f"ERM+{adapter}")] == pytest.approx(oracle, abs=1e-12)
    assert ("training", "test", "ERM+TentFull") not in cells and ("training", "test", "ERM") in cells
    code, out, _ = run_cli(capsys, "collect", "--input_dir", str(sweep))
    assert "rows X+ADAPTER: X's selected weights adapted at test time" in out and "| ERM+SHOTIM " in out
    assert "2 done runs, " in out  # adapted results are not runs


def test_adapt_sweep_refuses_fewer_than_one_worker(sweep):
    """adapt_sweep runs the local launcher, or the parallel one for workers above 1 (test_adapt_launchers)."""
    from domaingen.adapt import adapt_sweep

    with pytest.raises(DomaingenError, match="^--workers must be at least 1, got 0$"):
        adapt_sweep(sweep, ["T3A"], workers=0)
