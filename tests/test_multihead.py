"""MultiHead: the loss and predictions by hand, ModReg's composition, bad domain arguments."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from domaingen.errors import DomaingenError
from domaingen.masks.weight_masks import reuse_penalty, specialization_penalty
from tests.test_algorithms_generic import NUM_DOMAINS, build, separable_batches

SHAPE = (12,)


def mlp_multihead(name: str = "MultiHead", **overrides):
    return build(name, SHAPE, num_classes=3, featurizer="MLP", mlp_width=8, **overrides)


def hand_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Mean over examples of -log softmax(logits)[y], by a loop."""
    total = 0.0
    for row, label in zip(logits.tolist(), y.tolist()):
        top = max(row)
        total += -(row[label] - top - math.log(sum(math.exp(v - top) for v in row)))
    return total / len(y)


def test_one_head_per_training_domain():
    algorithm = mlp_multihead()
    assert len(algorithm.classifier.heads) == NUM_DOMAINS
    weights = [head.weight for head in algorithm.classifier.heads]
    assert all(w.shape == (3, algorithm.featurizer.n_outputs) for w in weights)
    assert len({id(w) for w in weights}) == NUM_DOMAINS


def test_loss_is_each_examples_own_head_cross_entropy_by_hand():
    algorithm = mlp_multihead()
    batches = [(x, y % 3) for x, y in separable_batches(SHAPE, n=5, seed=1)]
    expected = []
    with torch.no_grad():
        for d, (x, y) in enumerate(batches):
            head = algorithm.classifier.heads[d]
            features = algorithm.featurizer(x)
            logits = features @ head.weight.T + head.bias
            expected.append((logits, y))
    all_logits = torch.cat([l for l, _ in expected])
    all_y = torch.cat([y for _, y in expected])
    loss = algorithm.update(batches)["loss"]
    assert loss == pytest.approx(hand_cross_entropy(all_logits, all_y), rel=1e-5)


def test_known_domain_uses_its_head_and_ood_averages_the_heads_logits():
    algorithm = mlp_multihead()
    x = separable_batches(SHAPE, n=6, seed=2)[0][0]
    with torch.no_grad():
        features = algorithm.featurizer(x)
        per_head = [features @ h.weight.T + h.bias for h in algorithm.classifier.heads]
        for d in range(NUM_DOMAINS):
            torch.testing.assert_close(algorithm.predict(x, domain=d), per_head[d])
            torch.testing.assert_close(algorithm.predict_mode(x, "kd", d), per_head[d])
        torch.testing.assert_close(algorithm.predict(x), sum(per_head) / NUM_DOMAINS)
        torch.testing.assert_close(algorithm.network(x), sum(per_head) / NUM_DOMAINS)
        domains = torch.tensor([2, 0, 1, 1, 0, 2])
        expected = torch.stack([per_head[int(d)][i] for i, d in enumerate(domains)])
        torch.testing.assert_close(algorithm.predict(x, domain=domains), expected)


def test_modreg_masks_every_head_and_its_step_is_one_adam_step_on_loss_plus_penalty():
    a = mlp_multihead("MultiHead+ModReg", modreg_alpha=1e-3, modreg_beta=1e-2)
    masked = {name for name, _ in a.modreg_layers()}
    assert {f"classifier.heads.{d}" for d in range(NUM_DOMAINS)} <= masked
    b = copy.deepcopy(a)
    batches = [(x, y % 3) for x, y in separable_batches(SHAPE, n=8)]
    torch.manual_seed(7)
    a.update(batches)
    torch.manual_seed(7)
    # one featurizer pass over the concatenated batch: ModReg's mask groups interleave its rows
    features = b.featurizer(torch.cat([x for x, _ in batches])).split([len(y) for _, y in batches])
    logits = torch.cat([b.classifier.heads[d](f) for d, f in enumerate(features)])
    y = torch.cat([y for _, y in batches])
    mask_logits = [m.mask_logits for m in b.modules() if hasattr(m, "mask_logits")]
    loss = torch.nn.functional.cross_entropy(logits, y)
    loss = loss + 1e-3 * sum(specialization_penalty(l) for l in mask_logits) \
        + 1e-2 * sum(reuse_penalty(l) for l in mask_logits)
    b.optimizer.zero_grad()
    loss.backward()
    b.optimizer.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


@pytest.mark.parametrize("domain, message", [
    (3, "out of range"), (-1, "out of range"), (torch.tensor([0.5]), "integer"), (torch.tensor([0, 1]), "one index or one per example"),
])
def test_bad_domain_is_one_clear_line(domain, message):
    algorithm = mlp_multihead()
    x = separable_batches(SHAPE, n=3)[0][0]
    with pytest.raises(DomaingenError, match=message):
        algorithm.predict(x, domain=domain)


def test_unknown_mode_names_the_valid_one():
    with pytest.raises(DomaingenError, match="valid modes: kd"):
        mlp_multihead().predict_mode(torch.zeros(1, *SHAPE), "mask_ens")


def test_wrong_number_of_minibatches_is_refused():
    with pytest.raises(DomaingenError, match="built for 3 training domains but got 2"):
        mlp_multihead().update(separable_batches(SHAPE, n=4, domains=2))


@pytest.mark.parametrize("name", ["MultiHead", "MultiHead+ModReg", "MultiHead+EMA"])
def test_every_mode_from_one_featurizer_pass_equals_each_mode_alone(name):
    from domaingen.run.evaluation import split_mode_predictions

    algorithm = mlp_multihead(name)
    batches = separable_batches(SHAPE, n=8)
    for _ in range(2):
        algorithm.update([(x, y % 3) for x, y in batches])
    algorithm.eval()
    x = torch.cat([xb for xb, _ in batches])
    per_example = torch.arange(len(x)) % NUM_DOMAINS
    passes = []
    algorithm.featurizer.register_forward_hook(lambda *_: passes.append(1))
    with torch.no_grad():
        for domain in (1, per_example):
            default, kd = algorithm.predict_modes(x, [None, "kd"], domain)
            assert len(passes) == 1
            assert torch.equal(default, algorithm.predict(x)) and torch.equal(kd, algorithm.predict_mode(x, "kd", domain))
            assert torch.equal(algorithm.predict_modes(x, ["kd", None], domain)[0], kd)
            passes.clear()
        assert torch.equal(algorithm.predict_modes(x, [None])[0], algorithm.predict(x))
        # evaluation reads each batch once and predicts every mode from it
        passes.clear()
        labels = torch.cat([yb % 3 for _, yb in batches])
        (pred_default, pred_kd), seen = split_mode_predictions(algorithm, [(x, labels)], torch.device("cpu"),
                                                               modes=[None, "kd"], domain=2)
        assert len(passes) == 1 and torch.equal(seen, labels)
        assert torch.equal(pred_default, algorithm.predict(x).argmax(1))
        assert torch.equal(pred_kd, algorithm.predict_mode(x, "kd", 2).argmax(1))
    with pytest.raises(DomaingenError, match="needs domain="):
        algorithm.predict_modes(x, [None, "kd"])
