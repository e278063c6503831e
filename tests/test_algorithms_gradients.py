"""ANDMask, IGA, Fishr, TRM and Transfer against hand computations of their formulas; their
hyperparameters, refusals, bf16 autocast and resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from domaingen.run import training
from domaingen.algorithms import ALGORITHMS
from domaingen.algorithms.andmask import and_mask
from domaingen.algorithms.fishr import per_example_head_gradients
from domaingen.algorithms.iga import gradient_variance
from domaingen.algorithms.transfer import loss_gap
from domaingen.algorithms.trm import head_hessian_vector, neumann_inverse_hvp
from domaingen.datasets import DATASETS
from domaingen.errors import DomaingenError
from domaingen.hparams import draw_hparams, run_space
from domaingen.run.training import TrainConfig, train
from domaingen.testing import VOLATILE_FIELDS
from test_algorithms_generic import build, separable_batches

NAMES = ["ANDMask", "IGA", "Fishr", "TRM", "Transfer"]
SMALL_MLP = {"featurizer": "MLP", "mlp_width": 8, "mlp_depth": 3}


def captured_gradients(algorithm, minibatches) -> list[torch.Tensor]:
    """The gradients `algorithm.update` hands its optimizer (the step itself is skipped)."""
    seen: list[torch.Tensor] = []

    def capture(*args, **kwargs):
        seen.extend(p.grad.detach().clone() for p in algorithm.network.parameters())

    algorithm.optimizer.step = capture
    algorithm.update(minibatches)
    return seen


def drawn(name: str, key: str, seeds=range(1, 41)) -> list[float]:
    space = run_space("ColoredMNIST", DATASETS.get("ColoredMNIST"), ALGORITHMS.get(name))
    return [draw_hparams(space, "ColoredMNIST", s)[key] for s in seeds]


# --- ANDMask ---


def test_and_mask_keeps_the_elements_whose_signs_agree_by_counting():
    g = torch.Generator().manual_seed(0)
    grads = torch.randn(5, 40, generator=g, dtype=torch.float64)
    grads[:, :5] = 0.0  # zero gradients have sign 0
    for tau in (1.0, 0.6, 0.2):
        expected = []
        for j in range(grads.shape[1]):
            positive = sum(1 for e in range(5) if grads[e, j] > 0)
            negative = sum(1 for e in range(5) if grads[e, j] < 0)
            expected.append(1.0 if abs(positive - negative) / 5 >= tau else 0.0)
        assert and_mask(grads, tau).tolist() == expected


def test_andmask_step_is_the_masked_mean_gradient_rescaled_by_the_kept_fraction():
    shape = (6,)
    algorithm = build("ANDMask", shape, seed=3, tau=0.6, **SMALL_MLP)
    batches = separable_batches(shape, n=8, seed=1, domains=5)
    expected = []
    per_env = []
    for x, y in batches:
        algorithm.network.zero_grad()
        F.cross_entropy(algorithm.network(x), y).backward()
        per_env.append([p.grad.clone().numpy() for p in algorithm.network.parameters()])
    for i, _ in enumerate(algorithm.network.parameters()):
        stack = np.stack([env[i] for env in per_env])
        mask = (np.abs(np.sign(stack).mean(0)) >= 0.6).astype(np.float32)
        expected.append(mask * stack.mean(0) / (1e-10 + mask.mean()))
    got = captured_gradients(algorithm, batches)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-5, atol=1e-7)


def test_andmask_and_sandmask_draw_tau_from_their_own_distributions():
    assert ALGORITHMS.get("ANDMask").hparam_space()["tau"].default == 1.0
    assert ALGORITHMS.get("SANDMask").hparam_space()["tau"].default != 1.0
    and_tau, sand_tau = drawn("ANDMask", "tau"), drawn("SANDMask", "tau")
    assert all(0.5 <= t <= 1.0 for t in and_tau)  # U(0.5, 1)
    assert all(0.0 <= t <= 1.0 for t in sand_tau) and min(sand_tau) < 0.5  # U(0, 1)
    assert and_tau != sand_tau


def test_andmask_tau_out_of_range_is_one_line():
    with pytest.raises(DomaingenError, match=r"^tau must be in \[0, 1\] \(a fraction of agreeing environments\), got 1\.5$"):
        ALGORITHMS.get("ANDMask").check_hparams({"tau": 1.5})


# --- IGA ---


def iga_penalty_by_loops(network: nn.Module, batches) -> torch.Tensor:
    """sum_e ||g_e - mean g||^2 with each g_e from its own backward pass (float64)."""
    grads = []
    for x, y in batches:
        g = torch.autograd.grad(F.cross_entropy(network(x), y), list(network.parameters()))
        grads.append(torch.cat([t.flatten() for t in g]))
    stacked = torch.stack(grads)
    return ((stacked - stacked.mean(0)) ** 2).sum()


def test_iga_gradient_is_the_derivative_of_risk_plus_penalty_by_finite_differences():
    shape = (3,)
    algorithm = build("IGA", shape, seed=0, penalty=7.0, featurizer="MLP", mlp_width=3, mlp_depth=3).double()
    batches = [(x.double(), y) for x, y in separable_batches(shape, n=6, seed=2)]
    network = algorithm.network
    params = list(network.parameters())

    def objective() -> float:
        risk = np.mean([F.cross_entropy(network(x), y).item() for x, y in batches])
        return risk + 7.0 * iga_penalty_by_loops(network, batches).item()

    got = captured_gradients(algorithm, batches)
    g = torch.Generator().manual_seed(0)
    eps = 1e-5
    for _ in range(4):  # central differences along random directions: d.grad = (f(w + eps d) - f(w - eps d)) / 2 eps
        direction = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params]
        with torch.no_grad():
            for p, d in zip(params, direction):
                p.add_(d, alpha=eps)
        up = objective()
        with torch.no_grad():
            for p, d in zip(params, direction):
                p.add_(d, alpha=-2 * eps)
        down = objective()
        with torch.no_grad():
            for p, d in zip(params, direction):
                p.add_(d, alpha=eps)
        slope = sum((gr * d).sum().item() for gr, d in zip(got, direction))
        assert slope == pytest.approx((up - down) / (2 * eps), rel=1e-6)


def test_iga_penalty_value_is_the_sum_of_squared_deviations_from_the_mean_gradient():
    shape = (5,)
    algorithm = build("IGA", shape, seed=1, **SMALL_MLP)
    batches = separable_batches(shape, n=8, seed=4)
    expected = iga_penalty_by_loops(algorithm.network, batches).item()
    params = list(algorithm.network.parameters())
    grads = [torch.autograd.grad(F.cross_entropy(algorithm.network(x), y), params) for x, y in batches]
    assert gradient_variance(grads).item() == pytest.approx(expected, rel=1e-5)
    assert algorithm.update(batches)["penalty"] == pytest.approx(expected, rel=1e-5)


def test_iga_learns_with_a_small_penalty_and_stays_constant_with_domainbeds():
    shape = (2, 14, 14)
    held_out = separable_batches(shape, n=64, seed=99)
    x, y = torch.cat([b[0] for b in held_out]), torch.cat([b[1] for b in held_out])
    losses = {}
    for penalty in (1.0, 1000.0):
        algorithm = build("IGA", shape, featurizer="MLP", mlp_width=32, penalty=penalty)
        for step in range(25):
            algorithm.update(separable_batches(shape, seed=step))
        with torch.no_grad():
            losses[penalty] = F.cross_entropy(algorithm.predict(x), y).item()
    assert losses[1.0] < 0.1
    assert losses[1000.0] > 0.5  # from about log 2 = 0.69


def test_iga_with_modreg_is_refused_with_the_reason():
    with pytest.raises(DomaingenError, match=r"^ModReg cannot be composed with IGA: its penalty's gradient "
                                             r"differentiates the environments' gradients \(double backpropagation\)"):
        ALGORITHMS.get("IGA+ModReg")


# --- Fishr ---


@pytest.mark.parametrize("classes", [3, 1])
def test_per_example_head_gradients_equal_a_loop_over_examples(classes):
    g = torch.Generator().manual_seed(0)
    head = nn.Linear(4, classes).double()
    z = torch.randn(7, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, max(classes, 2), (7,), generator=g)
    loss_fn = (lambda out, t: F.cross_entropy(out, t)) if classes > 1 else \
        (lambda out, t: F.binary_cross_entropy_with_logits(out[:, 0], t.double()))
    rows = []
    for n in range(7):
        gw, gb = torch.autograd.grad(loss_fn(head(z[n:n + 1]), y[n:n + 1]), [head.weight, head.bias])
        rows.append(torch.cat([gw.flatten(), gb]))
    torch.testing.assert_close(per_example_head_gradients(z, head(z), y), torch.stack(rows))


def fishr_penalty_by_hand(algorithm, batches, ema_state: np.ndarray, ema: float):
    """(penalty, new moving averages): per domain the variance over its examples of each
    example's head gradient, averaged with the past, divided by 1 - ema, and its squared
    deviation from the mean over domains, averaged over elements and domains."""
    with torch.no_grad():
        feats = [algorithm.featurizer(x).double() for x, _ in batches]
        w, b = algorithm.classifier.weight.double(), algorithm.classifier.bias.double()
    variances = []
    for z, (_, y) in zip(feats, batches):
        rows = []
        for n in range(len(y)):
            p = torch.softmax(z[n] @ w.T + b, 0).numpy()
            p[y[n]] -= 1.0
            rows.append(np.concatenate([np.outer(p, z[n].numpy()).ravel(), p]))
        variances.append(np.var(np.array(rows), axis=0))
    new_state = ema * ema_state + (1 - ema) * np.array(variances)
    corrected = new_state / (1 - ema)
    deviations = [np.mean((corrected[d] - corrected.mean(0)) ** 2) for d in range(len(batches))]
    return float(np.mean(deviations)), new_state


def test_fishr_penalty_and_moving_averages_equal_the_hand_computation():
    shape = (5,)
    ema = 0.8
    algorithm = build("Fishr", shape, seed=2, ema=ema, penalty_anneal_iters=0, **SMALL_MLP)
    state = np.zeros(tuple(algorithm.variance_ema.shape))
    for step in range(3):
        batches = separable_batches(shape, n=6, seed=step)
        expected, state = fishr_penalty_by_hand(algorithm, batches, state, ema)
        out = algorithm.update(batches)
        assert out["penalty"] == pytest.approx(expected, rel=1e-4)
        assert out["loss"] == pytest.approx(out["nll"] + 1000.0 * out["penalty"], rel=1e-5)
        np.testing.assert_allclose(algorithm.variance_ema.numpy(), state, rtol=1e-4, atol=1e-10)


def test_fishr_penalty_weight_is_zero_until_annealed_then_adam_restarts():
    shape = (5,)
    algorithm = build("Fishr", shape, penalty_anneal_iters=2, **SMALL_MLP)
    first = algorithm.optimizer
    for step in range(4):
        out = algorithm.update(separable_batches(shape, seed=step))
        weight = 0.0 if step < 2 else 1000.0
        assert out["loss"] == pytest.approx(out["nll"] + weight * out["penalty"], rel=1e-5)
        assert (algorithm.optimizer is first) == (step < 2)


def test_fishr_lambda_is_its_own_distribution():
    values = drawn("Fishr", "lambda")
    assert ALGORITHMS.get("Fishr").hparam_space()["lambda"].default == 1000.0
    assert all(10.0 <= v <= 1e4 for v in values) and max(values) > 1000  # 10^U(1, 4)
    assert all(0 <= v < 5000 and isinstance(v, int) for v in drawn("Fishr", "penalty_anneal_iters"))


@pytest.mark.parametrize("key, value, message", [
    ("ema", 1.0, r"^ema must be in \[0, 1\) \(the weight of past gradient variances\), got 1\.0$"),
    ("lambda", -1.0, r"^lambda must be >= 0 \(it weighs the gradient-variance penalty\), got -1\.0$"),
])
def test_fishr_out_of_range_values_are_one_line(key, value, message):
    with pytest.raises(DomaingenError, match=message):
        ALGORITHMS.get("Fishr").check_hparams({key: value})


# --- TRM ---


def test_head_hessian_vector_product_equals_the_explicit_hessian():
    g = torch.Generator().manual_seed(0)
    head = nn.Linear(3, 4).double()
    z = torch.randn(6, 3, generator=g, dtype=torch.float64)
    v = torch.randn(4, 3, generator=g, dtype=torch.float64)
    hessian = np.zeros((12, 12))
    with torch.no_grad():
        for n in range(6):
            p = torch.softmax(head(z[n]), 0).numpy()
            jac = np.diag(p) - np.outer(p, p)
            hessian += np.kron(jac, np.outer(z[n], z[n])) / 6  # weight flattened row-major (class, feature)
    with torch.no_grad():
        got = head_hessian_vector(head, z, v)
    np.testing.assert_allclose(got.numpy().ravel(), hessian @ v.numpy().ravel(), rtol=1e-10)


def test_neumann_series_sums_the_powers_of_i_minus_h_and_stops_past_the_bound():
    g = torch.Generator().manual_seed(1)
    head = nn.Linear(3, 2).double()
    z = torch.randn(10, 3, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, generator=g, dtype=torch.float64) * 0.1
    with torch.no_grad():
        columns = [head_hessian_vector(head, z, e.view(2, 3)).ravel() for e in torch.eye(6, dtype=torch.float64)]
        estimate = neumann_inverse_hvp(head, z, v)
    hessian = torch.stack(columns, dim=1).numpy()
    term, total = v.numpy().ravel(), v.numpy().ravel().copy()
    for _ in range(10):
        term = term - hessian @ term
        total = total + term
        if np.abs(total).max() > 10:
            break
    np.testing.assert_allclose(estimate.numpy().ravel(), total, rtol=1e-10)
    big = torch.full((2, 3), 6.0, dtype=torch.float64)  # the first term passes the bound: two terms
    with torch.no_grad():
        first = big - head_hessian_vector(head, z, big)
        assert torch.allclose(neumann_inverse_hvp(head, z, big), big + first)


def trm_loss_by_hand(algorithm, batches, cos_lambda, eta):
    """TRM's transfer term and next pair weights, by autograd on copies of the heads (float64)."""
    heads = [nn.Linear(h.in_features, h.out_features).double() for h in algorithm.heads]
    for mine, theirs in zip(heads, algorithm.heads):
        mine.load_state_dict(theirs.state_dict())
    with torch.no_grad():
        feats = [algorithm.featurizer(x).double() for x, _ in batches]
    labels = [y for _, y in batches]
    for head, z, y in zip(heads, feats, labels):
        sgd = torch.optim.SGD(head.parameters(), lr=0.1)
        for _ in range(30):
            sgd.zero_grad()
            F.cross_entropy(head(z), y).backward()
            sgd.step()
    weights = algorithm.pair_weights.double() / algorithm.pair_weights.double().sum(1, keepdim=True)
    new_weights = weights.clone()
    total = 0.0
    for q, head in enumerate(heads):
        def hvp(v):
            g = torch.autograd.grad(F.cross_entropy(head(feats[q]), labels[q]), head.weight, create_graph=True)[0]
            return torch.autograd.grad((g * v).sum(), head.weight)[0]
        others = [p for p in range(len(batches)) if p != q]
        risks = {p: F.cross_entropy(head(feats[p]), labels[p]).item() for p in others}
        grad_p = sum(weights[q, p] * torch.autograd.grad(F.cross_entropy(head(feats[p]), labels[p]), head.weight)[0]
                     for p in others)
        term, direction = grad_p, grad_p.clone()
        for _ in range(10):
            term = term - hvp(term)
            direction = direction + term
            if direction.abs().max() > 10:
                break
        grad_q = torch.autograd.grad(F.cross_entropy(head(feats[q]), labels[q]), head.weight)[0]
        total += sum(weights[q, p].item() * risks[p] for p in others) - cos_lambda * (direction * grad_q).sum().item()
        for p in others:
            new_weights[q, p] = weights[q, p] * np.exp(eta * weights[q, p].item() * risks[p])
    return total / len(batches), new_weights


def test_trm_transfer_term_and_pair_weights_equal_the_hand_computation():
    shape = (5,)
    cos_lambda, eta = 0.5, 0.1
    algorithm = build("TRM", shape, seed=4, iters=1, cos_lambda=cos_lambda, groupdro_eta=eta, **SMALL_MLP)
    assert algorithm.update(separable_batches(shape, seed=0))["trm_loss"] == 0.0  # the ERM phase
    for step in range(1, 3):
        batches = separable_batches(shape, n=8, seed=step)
        expected, weights = trm_loss_by_hand(algorithm, batches, cos_lambda, eta)
        out = algorithm.update(batches)
        assert out["trm_loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
        torch.testing.assert_close(algorithm.pair_weights.double(), weights, rtol=1e-5, atol=1e-7)


def test_trm_transfer_terms_train_the_featurizer_and_leave_the_classifier_to_the_risk():
    shape = (5,)
    algorithm = build("TRM", shape, seed=4, iters=0, cos_lambda=0.5, **SMALL_MLP)
    batches = separable_batches(shape, n=8, seed=1)
    reference = build("TRM", shape, seed=4, iters=10**6, **SMALL_MLP)  # ERM only
    with_transfer = captured_gradients(algorithm, batches)
    erm = captured_gradients(reference, batches)
    n_feat = len(list(algorithm.featurizer.parameters()))
    for a, b in zip(with_transfer[n_feat:], erm[n_feat:]):
        torch.testing.assert_close(a, b)
    assert any(not torch.allclose(a, b) for a, b in zip(with_transfer[:n_feat], erm[:n_feat]))


# --- Transfer ---


def test_loss_gap_is_the_largest_minus_the_smallest_environment_risk():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 3, generator=g)
    y = torch.randint(0, 3, (9,), generator=g)
    risks = [F.cross_entropy(logits[i:j], y[i:j]).item() for i, j in ((0, 2), (2, 6), (6, 9))]
    assert loss_gap(logits, y, [2, 4, 3]).item() == pytest.approx(max(risks) - min(risks), rel=1e-6)


def test_transfer_adversary_stays_in_the_ball_and_ascends_the_gap():
    shape = (5,)
    algorithm = build("Transfer", shape, seed=0, delta=0.05, d_steps_per_g=3, lr_d=1.0, **SMALL_MLP)
    batches = separable_batches(shape, n=8, seed=0)
    algorithm.update(batches)
    distance = torch.sqrt(sum((a - c).square().sum() for a, c in zip(
        algorithm.adversary.parameters(), (algorithm.classifier.weight, algorithm.classifier.bias))))
    assert distance.item() == pytest.approx(0.05, rel=1e-5)  # lr_d = 1 leaves the ball: projected onto it
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    with torch.no_grad():
        feats = algorithm.featurizer(x)
        adversarial = loss_gap(algorithm.adversary(feats), y, [8, 8, 8])
        own = loss_gap(algorithm.classifier(feats), y, [8, 8, 8])
    assert adversarial > own


def test_transfer_gda_trains_the_network_by_sgd():
    shape = (5,)
    algorithm = build("Transfer", shape, gda=True, **SMALL_MLP)
    assert isinstance(algorithm.optimizer, torch.optim.SGD)
    before = [p.detach().clone() for p in algorithm.network.parameters()]
    algorithm.update(separable_batches(shape, seed=0))
    assert all(not torch.equal(a, b) for a, b in zip(before, algorithm.network.parameters()))


@pytest.mark.parametrize("name, hparams, message", [
    ("Transfer", {"delta": -1.0}, r"^delta must be >= 0 \(the radius of the adversary's ball\), got -1\.0$"),
    ("Transfer", {"d_steps_per_g": 1.5}, r"^d_steps_per_g must be an integer >= 0, got 1\.5$"),
    ("TRM", {"iters": -1}, r"^iters must be >= 0 \(ERM updates before the transfer terms\), got -1$"),
    ("IGA", {"penalty": -1}, r"^penalty must be >= 0 \(it weighs the gradient variance\), got -1$"),
])
def test_out_of_range_values_are_one_line(name, hparams, message):
    with pytest.raises(DomaingenError, match=message):
        ALGORITHMS.get(name).check_hparams(hparams)


# --- every algorithm: domains, one logit, bf16, resume ---


@pytest.mark.parametrize("name", NAMES)
def test_one_training_domain_is_refused(name):
    with pytest.raises(DomaingenError, match=rf"^{name} needs at least 2 training domains, got 1; hold out fewer environments$"):
        ALGORITHMS.get(name).check_problem(1, {})


@pytest.mark.parametrize("domains", [2, 5])
@pytest.mark.parametrize("name", NAMES)
def test_two_and_five_domains_with_one_logit(name, domains):
    shape = (6,)
    torch.manual_seed(0)
    hparams = {"featurizer": "MLP", "mlp_width": 8, "single_logit": True, "penalty_anneal_iters": 0, "iters": 0}
    from domaingen.testing import default_hparams
    space = ALGORITHMS.get(name).hparam_space()
    algorithm = ALGORITHMS.get(name)(shape, 2, domains, default_hparams(name, **{k: v for k, v in hparams.items()
                                                                              if k in space or k in ("featurizer", "mlp_width", "single_logit")}))
    for step in range(2):
        out = algorithm.update(separable_batches(shape, n=6, seed=step, domains=domains))
        assert all(np.isfinite(v) for v in out.values())
    assert algorithm.predict(torch.zeros(3, 6)).shape == (3, 1)


@pytest.mark.parametrize("name", NAMES)
def test_one_update_under_bf16_autocast(name):
    shape = (2, 14, 14)
    algorithm = build(name, shape, featurizer="MNIST_CNN", **({"penalty_anneal_iters": 0} if name == "Fishr" else
                                                              {"iters": 0} if name == "TRM" else {}))
    with torch.autocast("cpu", torch.bfloat16):
        out = algorithm.update(separable_batches(shape, n=4))
    assert all(np.isfinite(v) for v in out.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", NAMES)
def test_updates_on_cuda_under_bf16(name):
    shape = (2, 14, 14)
    algorithm = build(name, shape, featurizer="MNIST_CNN", **({"penalty_anneal_iters": 0} if name == "Fishr" else
                                                              {"iters": 0} if name == "TRM" else {})).cuda()
    batches = [(x.cuda(), y.cuda()) for x, y in separable_batches(shape, n=4)]
    with torch.autocast("cuda", torch.bfloat16):
        out = algorithm.update(batches)
    assert all(np.isfinite(v) for v in out.values())


RESUME_HPARAMS = {"featurizer": "MLP", "mlp_width": 16, "batch_size": 8}
RESUME_EXTRA = {"Fishr": {"penalty_anneal_iters": 1}, "TRM": {"iters": 1}, "Transfer": {"d_steps_per_g": 2}}


@pytest.mark.parametrize("name", NAMES)
def test_an_interrupted_run_resumes_to_the_same_records(name, tmp_path, monkeypatch):
    def config(out):
        return TrainConfig(dataset="ColoredMNIST", algorithm=name, output_dir=str(out), test_envs=[2],
                           data_dir="embedded", hparams={**RESUME_HPARAMS, **RESUME_EXTRA.get(name, {})},
                           steps=6, checkpoint_freq=2)

    straight = train(config(tmp_path / "straight")).records
    real = training.evaluate
    calls = {"n": 0}

    def evaluate_then_die(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # after the checkpoints at steps 0 and 2
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "evaluate", evaluate_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(config(tmp_path / "resumed"))
    monkeypatch.setattr(training, "evaluate", real)
    resumed = train(config(tmp_path / "resumed")).records
    drop = VOLATILE_FIELDS
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed] == \
        [{k: v for k, v in r.items() if k not in drop} for r in straight]
    saved = torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=False)["algorithm"]
    assert set(STATE_KEYS.get(name, ())) <= set(saved["model"]) | set(saved["optimizers"])


# the training state beyond the network and its Adam that a checkpoint must hold
STATE_KEYS = {
    "Fishr": ("update_count", "variance_ema"),
    "TRM": ("update_count", "pair_weights", "heads.0.weight", "heads.1.bias"),
    "Transfer": ("adversary.weight", "adversary.bias", "adversary_optimizer"),
}


@pytest.mark.parametrize("args, message", [
    (["--algorithm", "Fishr", "--hparams", '{"ema": 1.0}'],
     "domaingen: error: ema must be in [0, 1) (the weight of past gradient variances), got 1.0"),
    (["--algorithm", "TRM", "--test_envs", "0", "1"],
     "domaingen: error: TRM needs at least 2 training domains, got 1; hold out fewer environments"),
    (["--algorithm", "IGA+ModReg"],
     "domaingen: error: ModReg cannot be composed with IGA: its penalty's gradient differentiates the "
     "environments' gradients (double backpropagation), which ModReg's masked layers do not support"),
])
def test_refusals_on_the_command_line_are_one_line_and_exit_2(args, message, tmp_path, capsys):
    from domaingen.cli import main

    out = tmp_path / "run"
    code = main(["-q", "train", "--dataset", "ColoredMNIST", "--data_dir", "embedded", "--steps", "1",
                 "--output_dir", str(out), *args])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]
    assert not out.exists()
