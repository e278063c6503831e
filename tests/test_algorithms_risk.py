"""GroupDRO, Mixup, MLDG, ARM, RSC, SD and EQRM against hand computations of their papers' formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import FAST_HPARAMS
from domaingen import networks
from domaingen.run import training
from domaingen.algorithms import ALGORITHMS
from domaingen.algorithms.eqrm import kde_quantile, kde_quantile_bisection
from domaingen.datasets import DATASETS
from domaingen.errors import DomaingenError
from domaingen.hparams import draw_hparams, run_space
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, train
from domaingen.testing import VOLATILE_FIELDS
from test_algorithms_generic import build, default_hparams, separable_batches

FLAT = (6,)
RISK_ALGORITHMS = ["GroupDRO", "Mixup", "MLDG", "ARM", "RSC", "SD", "EQRM"]


def tiny(name, domains=3, num_classes=3, seed=0, **overrides):
    """`name` on 6 flat features, an MLP featurizer 6 -> 8 -> 8 without dropout, `domains` training domains."""
    torch.manual_seed(seed)
    hparams = default_hparams(name, featurizer="MLP", mlp_width=8, mlp_depth=2, mlp_dropout=0.0, **overrides)
    return ALGORITHMS.get(name)(FLAT, num_classes, domains, hparams)


def flat_batches(domains=3, n=10, num_classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, *FLAT, generator=g), torch.randint(0, num_classes, (n,), generator=g)) for _ in range(domains)]


def np_ce(logits: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy, written out: log sum exp - the true logit."""
    out = []
    for z, label in zip(logits, y):
        top = z.max()
        out.append(top + math.log(sum(math.exp(v - top) for v in z)) - z[label])
    return float(np.mean(out))


def first_adam_gradient(algorithm, params):
    """The gradient of the first Adam step: its first moment / (1 - beta1)."""
    beta1 = algorithm.optimizer.param_groups[0]["betas"][0]
    return [algorithm.optimizer.state[p]["exp_avg"] / (1 - beta1) for p in params]


# --- GroupDRO ---


def test_groupdro_weights_and_loss_follow_exponentiated_gradient():
    algorithm = tiny("GroupDRO", groupdro_eta=0.5)
    q = np.ones(3) / 3
    for step in range(3):
        batches = flat_batches(seed=step)
        with torch.no_grad():
            risks = [np_ce(algorithm.predict(x).double().numpy(), y.numpy()) for x, y in batches]
        weights = [q[e] * math.exp(0.5 * risks[e]) for e in range(3)]
        q = np.array([w / sum(weights) for w in weights])
        out = algorithm.update(batches)
        assert out["loss"] == pytest.approx(sum(q[e] * risks[e] for e in range(3)), rel=1e-5)
        np.testing.assert_allclose(algorithm.q.numpy(), q, rtol=1e-5)
        assert [out[f"q{e}"] for e in range(3)] == pytest.approx(list(q), rel=1e-5)


def test_groupdro_refuses_a_different_number_of_domains():
    with pytest.raises(DomaingenError, match=r"^GroupDRO was built for 3 training domains but got 2 minibatches$"):
        tiny("GroupDRO").update(flat_batches(domains=2))


# --- Mixup ---


@pytest.mark.parametrize("single_logit", [False, True])
def test_mixup_loss_is_the_mixed_cross_entropy_over_shifted_pairs(single_logit):
    classes = 2 if single_logit else 3
    algorithm = tiny("Mixup", num_classes=classes, mixup_alpha=0.7, single_logit=single_logit)
    batches = flat_batches(n=10, num_classes=classes, seed=4)
    batches[1] = (batches[1][0][:7], batches[1][1][:7])  # a shorter batch: pairs are truncated
    rng = np.random.RandomState(0)
    rng.set_state(algorithm.rng.get_state())
    torch.manual_seed(11)
    order = torch.randperm(3).tolist()
    expected = 0.0
    for k in range(3):
        (xi, yi), (xj, yj) = batches[order[k]], batches[order[(k + 1) % 3]]
        m = min(len(xi), len(xj))
        lam = rng.beta(0.7, 0.7)
        with torch.no_grad():
            z = algorithm.predict(lam * xi[:m] + (1 - lam) * xj[:m]).double().numpy()
        for weight, labels in ((lam, yi[:m].numpy()), (1 - lam, yj[:m].numpy())):
            if single_logit:  # logistic loss of one logit: log(1 + exp(-s z)), s = +-1
                expected += weight * np.mean([math.log1p(math.exp(-(2 * t - 1) * v)) for v, t in zip(z[:, 0], labels)])
            else:
                expected += weight * np_ce(z, labels)
    torch.manual_seed(11)
    assert algorithm.update(batches)["loss"] == pytest.approx(expected / 3, rel=1e-5)


def test_mixup_draws_continue_after_a_checkpoint():
    a = tiny("Mixup", seed=3)
    a.update(flat_batches())
    b = tiny("Mixup", seed=4)
    b.load_checkpoint_state(a.checkpoint_state())
    assert a.rng.beta(0.2, 0.2) == b.rng.beta(0.2, 0.2)


@pytest.mark.parametrize("alpha", [0.0, -1.0])
def test_mixup_refuses_a_non_positive_alpha(alpha):
    with pytest.raises(DomaingenError, match=rf"^mixup_alpha must be > 0 \(the parameter of Beta\(alpha, alpha\)\), got {alpha}$"):
        ALGORITHMS.get("Mixup").check_hparams(default_hparams("Mixup", mixup_alpha=alpha))


# --- MLDG ---


@pytest.mark.parametrize("domains,n_meta_test", [(3, 1), (3, 2), (2, 1), (5, 2)])
def test_mldg_meta_gradient_equals_hand_computation(domains, n_meta_test):
    algorithm = tiny("MLDG", domains=domains, n_meta_test=n_meta_test, mldg_beta=0.7, lr=1e-2)
    batches = flat_batches(domains=domains, seed=2)
    names = [n for n, _ in algorithm.network.named_parameters()]
    theta = {n: p.detach().clone().requires_grad_(True) for n, p in algorithm.network.named_parameters()}
    torch.manual_seed(5)
    order = torch.randperm(domains).tolist()
    train_ids, test_ids = order[: domains - n_meta_test], order[domains - n_meta_test:]

    def mean_risk(params, ids):
        total = 0.0
        for i in ids:
            x, y = batches[i]
            total = total + F.cross_entropy(torch.func.functional_call(algorithm.network, params, (x,)), y)
        return total / len(ids)

    grad_f = torch.autograd.grad(mean_risk(theta, train_ids), [theta[n] for n in names])
    # the virtual step: one step of a fresh Adam, theta - lr * g / (|g| + eps)
    virtual = {n: (theta[n] - 1e-2 * g / (g.abs() + 1e-8)).detach().requires_grad_(True) for n, g in zip(names, grad_f)}
    grad_g = torch.autograd.grad(mean_risk(virtual, test_ids), [virtual[n] for n in names])
    scale = (domains - n_meta_test) / domains
    expected = [scale * (gf + 0.7 * gg) for gf, gg in zip(grad_f, grad_g)]

    torch.manual_seed(5)
    out = algorithm.update(batches)
    got = first_adam_gradient(algorithm, list(algorithm.network.parameters()))
    for name, e, g in zip(names, expected, got):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-7, msg=name)
    with torch.no_grad():
        f, g = mean_risk(theta, train_ids).item(), mean_risk(virtual, test_ids).item()
    assert out["meta_train"] == pytest.approx(f, rel=1e-5) and out["meta_test"] == pytest.approx(g, rel=1e-5)
    assert out["loss"] == pytest.approx(f + 0.7 * g, rel=1e-5)


def test_mldg_refuses_too_many_meta_test_domains():
    mldg = ALGORITHMS.get("MLDG")
    message = r"^n_meta_test must be smaller than the number of training domains \(2\), got 2; MLDG needs at least one meta-train domain$"
    with pytest.raises(DomaingenError, match=message):
        mldg.check_problem(2, default_hparams("MLDG", n_meta_test=2))
    with pytest.raises(DomaingenError, match=r"^MLDG needs at least 2 training domains, got 1; hold out fewer environments$"):
        mldg.check_problem(1, default_hparams("MLDG", n_meta_test=1))
    with pytest.raises(DomaingenError, match=r"^n_meta_test must be an integer >= 1, got 0$"):
        mldg.check_hparams(default_hparams("MLDG", n_meta_test=0))
    mldg.check_problem(3, default_hparams("MLDG", n_meta_test=2))
    with pytest.raises(DomaingenError, match=message.replace(r"\(2\)", r"\(2\)")):
        tiny("MLDG", domains=3, n_meta_test=2).update(flat_batches(domains=2))


# --- ARM ---


def test_arm_predicts_from_the_mean_context_of_each_support_set():
    algorithm = tiny("ARM", batch_size=4)
    algorithm.eval()
    x = torch.randn(12, *FLAT)
    with torch.no_grad():
        rows = []
        for block in range(3):  # 12 = three support sets of 4
            part = x[4 * block: 4 * block + 4]
            context = algorithm.context_net(part).mean(dim=0, keepdim=True).expand(4, -1)
            rows.append(algorithm.network(torch.cat([part, context], dim=1)))
        torch.testing.assert_close(algorithm.predict(x), torch.cat(rows))
        odd = x[:7]  # not a multiple of the support size: one support set
        context = algorithm.context_net(odd).mean(dim=0, keepdim=True).expand(7, -1)
        torch.testing.assert_close(algorithm.predict(odd), algorithm.network(torch.cat([odd, context], dim=1)))


@pytest.mark.parametrize("support", [9, 16])
def test_arm_evaluates_in_domainbeds_batches_of_64_unpadded(support):
    """ARM's test-time context is the mean over a support set cut from the evaluation batch, so
    evaluation must cut the examples as DomainBed's train.py does (64 at a time, the last batch
    short), on every device: the context of each example is averaged, by hand here, over its
    block of `support` when `support` divides the batch's length, else over the whole batch."""
    from domaingen.datasets.environment import Environment
    from domaingen.datasets.splits import Split
    from domaingen.run.evaluation import CompiledPredict, eval_batch_size, split_accuracy

    shape = (2, 6, 6)
    algorithm = build("ARM", shape, arm_context_net="OneByOne", featurizer="MLP", mlp_width=8,
                      batch_size=support).eval()
    assert eval_batch_size(torch.device("cpu"), algorithm) == 64  # a convolutional model's CPU default is 128
    assert eval_batch_size(torch.device("cuda"), algorithm) == 64
    assert CompiledPredict(algorithm, 64).compiled is None  # padding would change the predictions
    n = 100  # batches of 64 and 36 (9 divides 36: blocks of 9; 16 divides neither 36 nor 100)
    # brightness rising along the split, so that contexts averaged over different blocks differ
    noise = torch.randint(0, 40, (n, *shape), generator=torch.Generator().manual_seed(0))
    x = (torch.arange(n).view(n, 1, 1, 1) * 2 + noise).to(torch.uint8)
    inputs, _ = Split(Environment("e", x, torch.zeros(n, dtype=torch.long)), torch.arange(n)).batch(slice(0, n))
    predicted = []
    with torch.no_grad():
        # the decision boundary through the middle of the first batch's logits, so that a context
        # averaged over other examples moves some predictions across it
        logits = algorithm.predict(inputs[:64])
        algorithm.classifier.bias[1] -= (logits[:, 1] - logits[:, 0]).median()
        for start in range(0, n, 64):
            batch = inputs[start:start + 64]
            block = support if len(batch) % support == 0 else len(batch)
            for first in range(0, len(batch), block):
                part = batch[first:first + block]
                context = algorithm.context_net(part).mean(dim=0, keepdim=True).expand(len(part), -1, -1, -1)
                predicted.append(algorithm.network(torch.cat([part, context], dim=1)).argmax(1))
    # labelled with the hand-computed predictions: DomainBed's batching predicts all of them
    split = Split(Environment("e", x, torch.cat(predicted)), torch.arange(n))
    assert split_accuracy(algorithm, split, torch.device("cpu")) == 1.0
    # 128 at a time (the CPU default for a convolutional model) averages other contexts
    assert split_accuracy(algorithm, split, torch.device("cpu"), batch_size=128) < 1.0


@pytest.mark.parametrize("train_context", [True, False])
def test_arm_trains_its_context_network_unless_asked_not_to(train_context):
    algorithm = tiny("ARM", batch_size=10, arm_train_context=train_context)
    before = [p.detach().clone() for p in algorithm.context_net.parameters()]
    algorithm.update(flat_batches())
    moved = [not torch.equal(a, b) for a, b in zip(before, algorithm.context_net.parameters())]
    assert all(moved) if train_context else not any(moved)


def test_arm_context_network_comes_from_the_registry_and_batch_size_from_domainbed():
    assert {"ARM_CNN", "ARM_MLP"} <= set(networks.CONTEXT_NETS.names())
    assert isinstance(build("ARM", (2, 14, 14)).context_net, networks.ARM_CNN)
    assert isinstance(build("ARM", (64,)).context_net, networks.ARM_MLP)
    arm, erm = ALGORITHMS.get("ARM"), ALGORITHMS.get("ERM")
    for dataset, arm_size, erm_size in (("PACS", 8, 32), ("ColoredMNIST", 64, 64)):
        assert draw_hparams(run_space(dataset, DATASETS.get(dataset), arm), dataset, 0)["batch_size"] == arm_size
        assert draw_hparams(run_space(dataset, DATASETS.get(dataset), erm), dataset, 0)["batch_size"] == erm_size
    assert draw_hparams(run_space("PACS", DATASETS.get("PACS"), arm), "PACS", 7)["batch_size"] == 8  # fixed


class OneByOne(nn.Module):
    """A plugin's context network: a 1x1 convolution to one channel."""

    def __init__(self, input_shape, hparams):
        super().__init__()
        self.conv = nn.Conv2d(input_shape[0], 1, 1)
        self.out_channels = 1

    def forward(self, x):
        return self.conv(x)


if "OneByOne" not in networks.CONTEXT_NETS:
    networks.CONTEXT_NETS.register("OneByOne")(OneByOne)


def test_arm_takes_a_plugin_context_network():
    algorithm = build("ARM", (2, 14, 14), arm_context_net="OneByOne", featurizer="MLP", mlp_width=16)
    assert isinstance(algorithm.context_net, OneByOne)
    algorithm.update(separable_batches((2, 14, 14), n=4))
    with pytest.raises(DomaingenError, match=r"^unknown context network 'nope'; valid: auto, ARM_CNN, ARM_MLP"):
        build("ARM", (2, 14, 14), arm_context_net="nope")


# --- RSC ---


@pytest.mark.parametrize("single_logit", [False, True])
def test_rsc_loss_mutes_the_top_gradient_features_of_the_most_changed_examples(single_logit):
    classes = 2 if single_logit else 3
    algorithm = tiny("RSC", num_classes=classes, single_logit=single_logit, rsc_f_drop_factor=0.25, rsc_b_drop_factor=0.4)
    batches = flat_batches(n=5, num_classes=classes, seed=7)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches]).numpy()
    with torch.no_grad():
        feats = algorithm.featurizer(x).double().numpy()
    w = algorithm.classifier.weight.detach().double().numpy()
    b = algorithm.classifier.bias.detach().double().numpy()

    def true_prob(z, label):
        if single_logit:
            return 1 / (1 + math.exp(-(2 * label - 1) * z[0]))
        e = np.exp(z - z.max())
        return e[label] / e.sum()

    masks, changes = [], []
    for f, label in zip(feats, y):
        # the gradient of the true-class logit w.r.t. the features of a linear head is a row of W
        grad = (2 * label - 1) * w[0] if single_logit else w[label]
        mask = grad < np.percentile(grad, 75)
        masks.append(mask)
        changes.append(true_prob(w @ f + b, label) - true_prob(w @ (f * mask) + b, label))
    muted = np.array(changes) >= np.percentile(changes, 60)
    logits = np.array([w @ (f * (m if drop else 1)) + b for f, m, drop in zip(feats, masks, muted)])
    if single_logit:
        expected = np.mean([math.log1p(math.exp(-(2 * t - 1) * z[0])) for z, t in zip(logits, y)])
    else:
        expected = np_ce(logits, y)
    assert muted.sum() == 6  # 40% of 15 examples
    assert algorithm.update(batches)["loss"] == pytest.approx(expected, rel=1e-5)


# --- SD ---


def test_sd_objective_is_cross_entropy_plus_mean_squared_logit():
    algorithm = tiny("SD", sd_reg=0.3)
    batches = flat_batches(seed=8)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    params = list(algorithm.network.parameters())
    z = algorithm.predict(x)
    n, k = z.shape
    penalty = sum(z[i, j] ** 2 for i in range(n) for j in range(k)) / (n * k)
    nll = sum(torch.logsumexp(z[i], 0) - z[i, y[i]] for i in range(n)) / n
    expected = torch.autograd.grad(nll + 0.3 * penalty, params)
    out = algorithm.update(batches)
    assert out["loss"] == pytest.approx(nll.item(), rel=1e-5) and out["penalty"] == pytest.approx(penalty.item(), rel=1e-5)
    for e, g in zip(expected, first_adam_gradient(algorithm, params)):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-7)


# --- EQRM ---


def np_kde_quantile(risks: np.ndarray, q: float) -> float:
    """The q-quantile of the Gaussian KDE (h = 1.06 std n^-1/5), by 200 bisection steps on its CDF."""
    h = 1.06 * risks.std(ddof=1) * len(risks) ** -0.2
    cdf = lambda k: np.mean([0.5 * (1 + math.erf((k - r) / (h * math.sqrt(2)))) for r in risks])
    lo, hi = risks.min() - 10 * h, risks.max() + 10 * h
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if cdf(mid) > q else (mid, hi)
    return 0.5 * (lo + hi)


@pytest.mark.parametrize("q", [0.3, 0.75, 0.95])
def test_kde_quantile_value_and_exact_gradient(q):
    risks_np = np.array([0.31, 0.52, 0.47, 0.9, 0.62])
    risks = torch.tensor(risks_np, requires_grad=True)
    value = kde_quantile(risks, q)
    assert value.item() == pytest.approx(np_kde_quantile(risks_np, q), abs=1e-7)
    (grad,) = torch.autograd.grad(value, risks)
    for i in range(5):  # central differences of the quantile itself
        step = np.zeros(5)
        step[i] = 1e-5
        fd = (np_kde_quantile(risks_np + step, q) - np_kde_quantile(risks_np - step, q)) / 2e-5
        assert grad[i].item() == pytest.approx(fd, rel=1e-4, abs=1e-6)
    # DomainBed's gradient: the bisection's two bounds only (smallest and largest risk) plus the bandwidth
    assert kde_quantile_bisection(risks.detach(), q).item() == pytest.approx(value.item(), abs=1e-6)


def test_eqrm_burns_in_with_the_mean_then_restarts_adam_at_ceil_burnin():
    algorithm = tiny("EQRM", eqrm_burnin_iters=1.5, eqrm_quantile=0.8, eqrm_lr=1e-4)
    first = algorithm.optimizer
    for step in range(4):
        batches = flat_batches(seed=step)
        with torch.no_grad():
            risks = np.array([np_ce(algorithm.predict(x).double().numpy(), y.numpy()) for x, y in batches])
        out = algorithm.update(batches)
        expected = risks.mean() if step < 2 else np_kde_quantile(risks, 0.8)
        assert out["loss"] == pytest.approx(expected, rel=1e-5)
        assert (algorithm.optimizer is first) == (step < 2)
    assert algorithm.optimizer.param_groups[0]["lr"] == 1e-4 and int(algorithm.update_count) == 4


@pytest.mark.parametrize("q", [0.0, 1.0, 1.5, -0.2])
def test_eqrm_refuses_a_quantile_outside_zero_one(q):
    with pytest.raises(DomaingenError, match=rf"^eqrm_quantile must be in \(0, 1\) \(a quantile\), got {q}$"):
        ALGORITHMS.get("EQRM").check_hparams(default_hparams("EQRM", eqrm_quantile=q))


def test_eqrm_needs_two_domains():
    with pytest.raises(DomaingenError, match=r"^EQRM needs at least 2 training domains, got 1; hold out fewer environments$"):
        ALGORITHMS.get("EQRM").check_problem(1, default_hparams("EQRM"))


# --- every algorithm: domain counts, one logit, bf16, checkpoint and resume ---


def domain_overrides(name, domains):
    return {"n_meta_test": 1} if name == "MLDG" else {}


@pytest.mark.parametrize("domains", [2, 3, 5])
@pytest.mark.parametrize("name", RISK_ALGORITHMS)
def test_every_domain_count(name, domains):
    algorithm = tiny(name, domains=domains, **domain_overrides(name, domains))
    for step in range(2):
        assert math.isfinite(algorithm.update(flat_batches(domains=domains, seed=step))["loss"])


@pytest.mark.parametrize("name", RISK_ALGORITHMS)
def test_one_logit_and_bf16_autocast(name):
    algorithm = tiny(name, num_classes=2, single_logit=True)
    batches = flat_batches(num_classes=2)
    assert algorithm.predict(batches[0][0]).shape == (10, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = [algorithm.update(batches)["loss"] for _ in range(2)]
    assert all(math.isfinite(v) for v in losses)


def test_ranges_of_the_other_hyperparameters_are_refused_in_one_line():
    cases = {
        ("GroupDRO", "groupdro_eta", -1.0): r"^groupdro_eta must be >= 0 \(a step size\), got -1.0$",
        ("SD", "sd_reg", -0.1): r"^sd_reg must be >= 0 \(it weighs a penalty\), got -0.1$",
        ("RSC", "rsc_f_drop_factor", 1.5): r"^rsc_f_drop_factor must be in \[0, 1\] \(a fraction\), got 1.5$",
        ("EQRM", "eqrm_gradient", "x"): r"^eqrm_gradient must be one of implicit, bisection, got 'x'$",
    }
    for (name, key, value), message in cases.items():
        with pytest.raises(DomaingenError, match=message):
            ALGORITHMS.get(name).check_hparams(default_hparams(name, **{key: value}))


def resume_config(out, name):
    hparams = {**FAST_HPARAMS, "mlp_width": 16}
    hparams.update({"MLDG": {"n_meta_test": 1}, "EQRM": {"eqrm_burnin_iters": 2},
                    "ARM": {"arm_context_net": "OneByOne", "batch_size": 16}}.get(name, {}))
    return TrainConfig(dataset="ColoredMNIST", algorithm=name, output_dir=str(out), test_envs=[2], data_dir="embedded",
                       hparams=hparams, steps=7, checkpoint_freq=3)


@pytest.mark.parametrize("name", RISK_ALGORITHMS)
def test_an_interrupted_run_resumes_to_the_same_records(tmp_path, monkeypatch, name):
    """Checkpoints carry every piece of state: GroupDRO's q, Mixup's generator, EQRM's count and restarted Adam."""
    train(resume_config(tmp_path / "straight", name))
    real_evaluate = training.evaluate
    calls = {"n": 0}

    def evaluate_then_die(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # after the checkpoint at step 3; EQRM's Adam restarted at step 2
            raise KeyboardInterrupt
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(training, "evaluate", evaluate_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(resume_config(tmp_path / "resumed", name))
    monkeypatch.setattr(training, "evaluate", real_evaluate)
    train(resume_config(tmp_path / "resumed", name))
    drop = VOLATILE_FIELDS
    stable = lambda records: [{k: v for k, v in r.items() if k not in drop} for r in records]
    straight = RunDirectory(tmp_path / "straight").records()
    assert [r["step"] for r in straight] == [0, 3, 6]
    assert stable(RunDirectory(tmp_path / "resumed").records()) == stable(straight)


def test_mldg_fits_a_drawn_n_meta_test_to_two_domains_but_refuses_a_given_one(tmp_path):
    from domaingen.errors import DomaingenError
    from domaingen.run.training import resolve

    run = resolve(TrainConfig(dataset="ColoredMNIST", algorithm="MLDG", test_envs=[2],
                              output_dir=str(tmp_path / "a"), data_dir="embedded"))
    assert run.hparams["n_meta_test"] == 1  # the default 2 leaves no meta-train domain of two
    run = resolve(TrainConfig(dataset="RotatedMNIST", algorithm="MLDG", test_envs=[0],
                              output_dir=str(tmp_path / "b"), data_dir="embedded"))
    assert run.hparams["n_meta_test"] == 2
    with pytest.raises(DomaingenError, match=r"^n_meta_test must be smaller than the number of training domains \(2\), got 2"):
        resolve(TrainConfig(dataset="ColoredMNIST", algorithm="MLDG", test_envs=[2], hparams='{"n_meta_test": 2}',
                            output_dir=str(tmp_path / "c"), data_dir="embedded"))
    assert not (tmp_path / "c").exists()
