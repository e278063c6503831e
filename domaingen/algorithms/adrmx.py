"""ADRMX (Demirel, Aptoula and Ozkan 2023, "Additive disentanglement of domain features with
remix loss"), as DomainBed trains it.

Two featurizers read each example: a label featurizer (features l) and a domain featurizer
(features d); their difference z = l - d is meant to be domain invariant. A domain
discriminator D reads z. The discriminator (its own Adam) and the rest (one Adam) alternate,
`d_steps_per_g_step` D steps per G step:

    D step:  min_D  CE(D(z), domain)
    G step:  min    CE(h1(l), y) + CE(h2(z), y) + dclf * CE(h_dom(d), domain) + rmxd * L_remix
                    + cnt * (SC(l) + SC(z)) - disc * CE(D(z), domain)

h1, h2 and h_dom are three-layer heads; predict is h1(l). SC is the supervised contrastive
loss with positives and negatives from the anchor's own domain weighted 0.5 and those from
other domains 0.5 (temperature 0.07). L_remix: for each class, the invariant features of
one example plus the domain features of another of that class from a different domain,
classified by h1 with the first example's label; summed over the classes that have such a
pair, divided by the number of classes.

DomainBed's remix indexes the whole batch with positions drawn within one class, so its
pairs are two of the batch's first n_c examples, of any class and domain. That is
`adrmx_remix_pairs` "domainbed"; the default "paper" pairs two examples of the class from
different domains (one torch.randperm per class either way, as DomainBed draws them).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from domaingen.algorithms.base import ALGORITHMS, Algorithm, FeaturizerClassifier, Minibatches, classification_loss, concat
from domaingen.algorithms.dann import adam, check_beta1, check_d_steps, discriminator_turn, domain_labels
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, by_dataset, choice
from domaingen.networks import MLP, build_featurizer

REMIX_PAIRS = ("paper", "domainbed")
TEMPERATURE = 0.07
SAME_DOMAIN_WEIGHT = 0.5


def three_layer_head(n_inputs: int, n_outputs: int) -> nn.Sequential:
    """Linear(n, n/2), ReLU, Linear(n/2, n/4), ReLU, Linear(n/4, out): DomainBed's nonlinear classifier."""
    return nn.Sequential(
        nn.Linear(n_inputs, n_inputs // 2), nn.ReLU(),
        nn.Linear(n_inputs // 2, n_inputs // 4), nn.ReLU(),
        nn.Linear(n_inputs // 4, n_outputs),
    )


def domain_weighted_supcon(features: torch.Tensor, y: torch.Tensor, domains: torch.Tensor,
                           same_domain_weight: float = SAME_DOMAIN_WEIGHT, temperature: float = TEMPERATURE) -> torch.Tensor:
    """Supervised contrastive loss whose pair terms are weighted w (same domain) or 1 - w (other domain).

    For anchor i with positives P_i (same class, j != i) and all others j != i:
    loss_i = mean_{p in P_i} log(w_ip e^{s_ip} / (sum_{j != i} w_ij e^{s_ij} + 1e-5) + 1e-5), with s the
    cosine similarity / temperature; the result is -sum_i loss_i / (N - #anchors without positives + 1).
    """
    u = F.normalize(features.float(), dim=1)
    # row i holds anchor i's similarities (read from column i, as the reference code does)
    sims = (u @ u.T / temperature).T
    n = len(y)
    others = ~torch.eye(n, dtype=torch.bool, device=y.device)
    same_domain = domains[:, None] == domains[None, :]
    positives = (y[:, None] == y[None, :]) & others
    weights = torch.where(same_domain, same_domain_weight, 1.0 - same_domain_weight)
    terms = weights * torch.exp(sims)
    denominator = (terms * others).sum(dim=1, keepdim=True) + 1e-5
    logs = torch.log(terms / denominator + 1e-5)
    counts = positives.sum(dim=1)
    has_positives = counts > 0
    per_anchor = (logs * positives).sum(dim=1)[has_positives] / counts[has_positives]
    return -per_anchor.sum() / (n - int((~has_positives).sum()) + 1)


@ALGORITHMS.register("ADRMX")
class ADRMX(FeaturizerClassifier):
    """ADRMX (Demirel et al. 2023): additively disentangled label/domain features, adversarial and remix losses."""

    HPARAMS = {
        "cnt_lambda": HParam(1.0, choice([1.0]), "weight of the two contrastive losses"),
        "dclf_lambda": HParam(1.0, choice([1.0]), "weight of the domain classifier's loss"),
        "disc_lambda": HParam(0.75, choice([0.75]), "weight of the adversarial (discriminator) term"),
        "rmxd_lambda": HParam(1.0, choice([1.0]), "weight of the remix loss"),
        "d_steps_per_g_step": HParam(2, choice([2]), "discriminator steps per generator step"),
        "beta1": HParam(0.5, choice([0.5]), "Adam beta1 of both optimizers (beta2 is 0.9)"),
        "mlp_width": HParam(256, choice([256]), "discriminator (and MLP featurizer) width"),
        "mlp_depth": HParam(9, choice([8, 9, 10]), "discriminator (and MLP featurizer) depth"),
        "mlp_dropout": HParam(0.0, choice([0.0]), "discriminator (and MLP featurizer) dropout"),
        "lr": by_dataset(HParam(3e-5, choice([2e-5, 3e-5, 4e-5, 5e-5]), "Adam learning rate (no weight decay)"),
                         ("small_images", HParam(3e-3, choice([5e-4, 1e-3, 2e-3, 3e-3]), "Adam learning rate (no weight decay)"))),
        "adrmx_remix_pairs": HParam("paper", help="paper (same class, different domains) or domainbed (its indexing)"),
    }
    MIN_TRAIN_DOMAINS = 2
    MIX_NUM = 1  # remixed pairs per class

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        Algorithm.__init__(self, input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)
        hp = self.hparams
        outputs = 1 if hp.get("single_logit") else num_classes
        if outputs == 1 and num_classes != 2:
            raise DomaingenError(f"single_logit needs a binary task, but there are {num_classes} classes")
        self.featurizer = build_featurizer(self.input_shape, hp)
        width = self.featurizer.n_outputs
        self.classifier = three_layer_head(width, outputs)
        self.prepare_modules()
        self.network = nn.Sequential(self.featurizer, self.classifier)
        self.domain_featurizer = build_featurizer(self.input_shape, hp)
        self.final_classifier = three_layer_head(width, outputs)
        self.domain_classifier = three_layer_head(width, num_domains)
        self.discriminator = MLP(width, num_domains, int(hp["mlp_width"]), int(hp["mlp_depth"]), float(hp["mlp_dropout"]))
        trained = nn.ModuleDict({
            "featurizer": self.featurizer, "domain_featurizer": self.domain_featurizer, "classifier": self.classifier,
            "final_classifier": self.final_classifier, "domain_classifier": self.domain_classifier,
        })
        self.optimizer = adam(trained, hp, hp["lr"], 0.0, hp["beta1"])
        self.disc_optimizer = adam(self.discriminator, hp, hp["lr"], 0.0, hp["beta1"])
        self.register_buffer("update_count", torch.tensor(0, dtype=torch.long))

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any]) -> None:
        super().check_hparams(hparams)
        check_d_steps(hparams)
        check_beta1(hparams)
        for key in ("cnt_lambda", "dclf_lambda", "disc_lambda", "rmxd_lambda"):
            if not float(hparams[key]) >= 0:
                raise DomaingenError(f"{key} must be >= 0 (it weighs a loss term), got {hparams[key]}")
        if hparams["adrmx_remix_pairs"] not in REMIX_PAIRS:
            raise DomaingenError(
                f"adrmx_remix_pairs must be one of {', '.join(REMIX_PAIRS)}, got {hparams['adrmx_remix_pairs']!r}")

    def remix_pairs(self, y: torch.Tensor, domains: torch.Tensor) -> tuple[list[int], list[int]]:
        """(content, domain) example indices of the remixed pairs, one draw per class."""
        firsts, seconds = [], []
        paper = self.hparams["adrmx_remix_pairs"] == "paper"
        for c in range(self.num_classes):
            members = torch.where(y == c)[0]
            for _ in range(self.MIX_NUM):
                perm = torch.randperm(members.numel())
                if len(perm) < 2:
                    continue
                if not paper:
                    firsts.append(int(perm[0]))
                    seconds.append(int(perm[1]))
                    continue
                ordered = members[perm.to(members.device)]
                other = torch.where(domains[ordered] != domains[ordered[0]])[0]
                if len(other):
                    firsts.append(int(ordered[0]))
                    seconds.append(int(ordered[other[0]]))
        return firsts, seconds

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        self.update_count += 1
        x, y = concat(minibatches)
        domains = domain_labels(minibatches)
        if discriminator_turn(int(self.update_count.item()), int(self.hparams["d_steps_per_g_step"])):
            with torch.no_grad():  # this step trains the discriminator only
                invariant = self.featurizer(x) - self.domain_featurizer(x)
            disc_loss = F.cross_entropy(self.discriminator(invariant).float(), domains)
            self.disc_optimizer.zero_grad(set_to_none=True)
            disc_loss.backward()
            self.disc_optimizer.step()
            with torch.no_grad():  # the network is left as it is: its terms are evaluated, not trained
                self.regularization()
            return {"loss": disc_loss.item(), "disc_loss": disc_loss.item()}
        hp = self.hparams
        label_features = self.featurizer(x)
        domain_features = self.domain_featurizer(x)
        invariant = label_features - domain_features
        disc_loss = F.cross_entropy(self.discriminator(invariant).float(), domains)
        domain_loss = F.cross_entropy(self.domain_classifier(domain_features).float(), domains)
        label_loss = classification_loss(self.classifier(label_features), y)
        final_loss = classification_loss(self.final_classifier(invariant), y)
        contrastive = domain_weighted_supcon(label_features, y, domains) + domain_weighted_supcon(invariant, y, domains)
        firsts, seconds = self.remix_pairs(y, domains)
        if firsts:
            mixed = invariant[firsts] + domain_features[seconds]
            remix = classification_loss(self.classifier(mixed), y[firsts]) * len(firsts) / (self.num_classes * self.MIX_NUM)
        else:
            remix = torch.zeros((), device=x.device)
        loss = (label_loss + final_loss + float(hp["dclf_lambda"]) * domain_loss + float(hp["rmxd_lambda"]) * remix
                + float(hp["cnt_lambda"]) * contrastive - float(hp["disc_lambda"]) * disc_loss)
        self.optimizer.zero_grad(set_to_none=True)
        trained = [p for group in self.optimizer.param_groups for p in group["params"] if p.requires_grad]
        (loss + self.regularization()).backward(inputs=trained)
        self.optimizer.step()
        return {"loss": loss.item(), "label_loss": label_loss.item(), "final_loss": final_loss.item(),
                "domain_loss": domain_loss.item(), "contrastive_loss": contrastive.item(), "remix_loss": remix.item(),
                "disc_loss": disc_loss.item()}
