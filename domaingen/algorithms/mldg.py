"""MLDG: meta-learning for domain generalization (Li et al., AAAI 2018), first-order."""

from __future__ import annotations

import copy
from typing import Any, Mapping

import torch

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss, make_adam
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, choice, log_uniform


@ALGORITHMS.register("MLDG")
class MLDG(FeaturizerClassifier):
    """Minimise F(theta) + mldg_beta * G(theta'), theta' = theta after one virtual step on F.

    Each update splits the training domains at random (one torch.randperm): the last
    `n_meta_test` in that order are meta-test, the others meta-train. F is the mean risk
    of the meta-train domains, G the mean risk of the meta-test domains (each with the
    regularization terms), as in the paper's Algorithm 1. The step uses the first-order
    meta-gradient grad F(theta) + beta * grad G(theta'), as DomainBed does.

    Where this departs from DomainBed: DomainBed pairs each meta-train domain with ONE
    meta-test domain (cycling through them) and takes a separate virtual step per pair,
    so with n_meta_test > number of meta-train domains some meta-test domains are never
    used (with 3 training domains and its default n_meta_test = 2, one domain is dropped
    from every update), and with no meta-train domain left nothing trains. Here F and G
    average over all their domains, as the paper does, and n_meta_test must be smaller
    than the number of training domains. The meta-gradient is scaled by (number of
    meta-train domains) / (number of domains), DomainBed's scale (its sum over pairs
    divided by the number of domains), which matters only through Adam's epsilon; so with
    two domains (one pair) the two updates are the same.
    Kept from DomainBed: the virtual step is one step of a fresh Adam (lr, weight_decay)
    rather than the paper's SGD step of size alpha, which DomainBed has no
    hyperparameter for; through such a step (about lr * sign of the gradient) the
    second-order term the paper differentiates is nearly zero anyway.
    """

    HPARAMS = {
        "mldg_beta": HParam(1.0, log_uniform(-1, 1), "weight of the meta-test risk"),
        "n_meta_test": HParam(2, choice([1, 2]), "training domains drawn as meta-test in each update"),
    }
    MIN_TRAIN_DOMAINS = 2

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)
        self.inner = copy.deepcopy(self.network)  # theta', reloaded from the network in every update

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any]) -> None:
        super().check_hparams(hparams)
        n = hparams["n_meta_test"]
        if isinstance(n, bool) or not isinstance(n, int) and not (isinstance(n, float) and n.is_integer()) or n < 1:
            raise DomaingenError(f"n_meta_test must be an integer >= 1, got {n!r}")

    @classmethod
    def check_problem(cls, num_train_domains: int, hparams: Mapping[str, Any], name: str | None = None) -> None:
        super().check_problem(num_train_domains, hparams, name)
        cls._check_split(int(hparams["n_meta_test"]), num_train_domains)

    @classmethod
    def fit_hparams(cls, hparams, num_train_domains, explicit=()):
        """A drawn or default n_meta_test that leaves no meta-train domain becomes
        num_train_domains - 1 (DomainBed's default 2 on ColoredMNIST's two training domains);
        one the user set is refused by check_problem instead."""
        fitted = dict(hparams)
        if "n_meta_test" not in explicit and num_train_domains >= 2 and int(fitted["n_meta_test"]) >= num_train_domains:
            fitted["n_meta_test"] = num_train_domains - 1
        return fitted

    @staticmethod
    def _check_split(n_meta_test: int, num_train_domains: int) -> None:
        if n_meta_test >= num_train_domains:
            raise DomaingenError(
                f"n_meta_test must be smaller than the number of training domains ({num_train_domains}), "
                f"got {n_meta_test}; MLDG needs at least one meta-train domain"
            )

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        n, k = len(minibatches), int(self.hparams["n_meta_test"])
        self._check_split(k, n)
        order = torch.randperm(n).tolist()
        meta_train = [minibatches[i] for i in order[: n - k]]
        meta_test = [minibatches[i] for i in order[n - k:]]

        self.inner.load_state_dict(self.network.state_dict())
        inner_params = list(self.inner.parameters())
        # F(theta), on the clone, which equals theta until its virtual step
        f_risk = torch.stack([classification_loss(self.inner(x), y) for x, y in meta_train]).mean()
        grads_f = torch.autograd.grad(f_risk + self.regularization(self.inner), inner_params, allow_unused=True)
        virtual = make_adam(self.inner, self.hparams)
        for p, g in zip(inner_params, grads_f):
            p.grad = g
        virtual.step()
        # G(theta'), differentiated at theta' (first order)
        g_risk = torch.stack([classification_loss(self.inner(x), y) for x, y in meta_test]).mean()
        grads_g = torch.autograd.grad(g_risk + self.regularization(self.inner), inner_params, allow_unused=True)

        beta = float(self.hparams["mldg_beta"])
        scale = (n - k) / n
        self.optimizer.zero_grad(set_to_none=True)
        for p, gf, gg in zip(self.network.parameters(), grads_f, grads_g):
            if gf is None and gg is None:
                continue
            grad = torch.zeros_like(p) if gf is None else gf.clone()
            if gg is not None:
                grad.add_(gg, alpha=beta)
            p.grad = grad.mul_(scale)
        self.optimizer.step()
        return {"loss": f_risk.item() + beta * g_risk.item(), "meta_train": f_risk.item(), "meta_test": g_risk.item()}
