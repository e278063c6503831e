"""TRM, transfer risk minimization (Xu & Jaakkola 2021, "Learning representations that support
robust transfer of predictors")."""

from __future__ import annotations

import torch
from torch import nn

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss
from domaingen.algorithms.fishr import logit_gradients
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, int_log_uniform, log_uniform

HEAD_STEPS = 30  # gradient steps that fit each domain's head on its (fixed) features, per update
HEAD_LR = 0.1
NEUMANN_TERMS = 10  # terms of the Neumann series for H^-1 v after the first
NEUMANN_BOUND = 10.0  # the series stops once an element of the estimate exceeds this


def head_weight_gradient(head: nn.Linear, features: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients (weight, bias) of the mean classification loss of `head` on (features, y), in closed form.

    Differentiable w.r.t. `features` and the head's parameters: mean_n outer(dl_n, z_n) and mean_n dl_n,
    with dl_n = d loss_n / d logits_n.
    """
    dlogits = logit_gradients(features @ head.weight.T + head.bias, y) / len(y)
    return dlogits.T @ features, dlogits.sum(dim=0)


def head_hessian_vector(head: nn.Linear, features: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """H v for the Hessian H of the mean classification loss w.r.t. the head's weight (its bias fixed).

    With p_n the predicted probabilities and u_n = V z_n: H v = mean_n (J_n u_n) z_n^T, where
    J_n = diag(p_n) - p_n p_n^T (softmax) or p_n (1 - p_n) (one logit).
    """
    logits = features @ head.weight.T + head.bias
    u = features @ vector.T
    if logits.shape[1] == 1:
        p = torch.sigmoid(logits)
        ju = p * (1 - p) * u
    else:
        p = torch.softmax(logits, dim=1)
        pu = p * u
        ju = pu - p * pu.sum(dim=1, keepdim=True)
    return ju.T @ features / len(features)


def neumann_inverse_hvp(head: nn.Linear, features: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """H^-1 v ~ sum_k (I - H)^k v, k = 0..NEUMANN_TERMS, stopped after the term that makes an element exceed NEUMANN_BOUND."""
    term = vector
    estimate = vector.clone()
    for _ in range(NEUMANN_TERMS):
        term = term - head_hessian_vector(head, features, term)
        estimate = estimate + term
        if estimate.abs().max() > NEUMANN_BOUND:
            break
    return estimate


@ALGORITHMS.register("TRM")
class TRM(FeaturizerClassifier):
    """Risk + transfer risk of per-domain heads h_Q to the other domains - cos_lambda * their gradient alignment.

    ERM for the first `iters` updates; then risk of all examples + (1/E) sum_Q [sum_{P != Q} a_QP R_P(h_Q)
    - cos_lambda * <H_Q^-1 sum_P a_QP grad R_P(h_Q), grad R_Q(h_Q)>], where h_Q is a linear head fitted to domain Q's
    features (HEAD_STEPS of gradient descent per update, warm-started), H_Q the Hessian of R_Q w.r.t. its
    weight (inverse by a Neumann series), and a_QP GroupDRO-style weights (rows normalised to 1,
    a_QP <- a_QP exp(groupdro_eta * a_QP R_P), the weighted risk in the exponent as in DomainBed).

    The classifier is trained by the risk of all examples only; the transfer terms train the featurizer.
    The heads, the weights a and the update count are buffers or parameters restored with checkpoints.

    Differs from DomainBed's class in two of its aliasing slips, both kept out here: its Neumann series
    adds (I - H) v in place of v as the first term (v is updated in place while the estimate still
    aliases it), and the gradient of a_QP R_P w.r.t. the features uses a_QP after this update's
    exponentiated step (the weight is updated in place before backpropagation), while its value uses a_QP
    before it; here both use the value before.
    One head per training domain (DomainBed builds one more, never used, so initial draws differ).
    The penalty terms are computed in fp32 (closed forms for the linear heads' gradients and
    Hessian-vector products, no double backpropagation).
    """

    HPARAMS = {
        "cos_lambda": HParam(1e-4, log_uniform(-5, 0), "weight of the gradient-alignment (transfer) term"),
        "iters": HParam(200, int_log_uniform(0, 4), "ERM updates before the transfer terms switch on"),
        "groupdro_eta": HParam(1e-2, log_uniform(-3, -1), "step size of the exponentiated domain-pair weights"),
    }
    MIN_TRAIN_DOMAINS = 2

    @classmethod
    def check_hparams(cls, hparams) -> None:
        super().check_hparams(hparams)
        iters = hparams.get("iters", 200)
        if not float(iters) >= 0:
            raise DomaingenError(f"iters must be >= 0 (ERM updates before the transfer terms), got {iters}")

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)
        width, outputs = self.classifier.in_features, self.classifier.out_features
        self.heads = nn.ModuleList(nn.Linear(width, outputs) for _ in range(num_domains))
        self.heads.requires_grad_(False)  # fitted in closed form, never by backpropagation
        self.register_buffer("update_count", torch.tensor(0, dtype=torch.long))
        self.register_buffer("pair_weights", torch.ones(num_domains, num_domains) - torch.eye(num_domains))

    def fit_heads(self, features: list[torch.Tensor], labels: list[torch.Tensor]) -> None:
        """HEAD_STEPS steps of gradient descent (lr HEAD_LR) of each domain's head on its features."""
        with torch.no_grad():
            for head, z, y in zip(self.heads, features, labels):
                for _ in range(HEAD_STEPS):
                    grad_weight, grad_bias = head_weight_gradient(head, z, y)
                    head.weight.sub_(grad_weight, alpha=HEAD_LR)
                    head.bias.sub_(grad_bias, alpha=HEAD_LR)

    def transfer_loss(self, features: list[torch.Tensor], labels: list[torch.Tensor]) -> torch.Tensor:
        """The transfer terms averaged over domains Q (fp32); updates the pair weights."""
        domains = len(features)
        fixed = [z.detach() for z in features]
        self.fit_heads(fixed, labels)
        cos_lambda, eta = float(self.hparams["cos_lambda"]), float(self.hparams["groupdro_eta"])
        total = features[0].new_zeros(())
        for q in range(domains):
            head = self.heads[q]
            weights = self.pair_weights[q].clone()
            others = [p for p in range(domains) if p != q]
            risks = [classification_loss(features[p] @ head.weight.T + head.bias, labels[p]) for p in others]
            transfer = sum(weights[p] * risk for p, risk in zip(others, risks))
            with torch.no_grad():
                grad_others = sum(weights[p] * head_weight_gradient(head, fixed[p], labels[p])[0] for p in others)
                direction = neumann_inverse_hvp(head, fixed[q], grad_others)
            grad_own = head_weight_gradient(head, features[q], labels[q])[0]
            total = total + transfer - cos_lambda * (direction * grad_own).sum()
            with torch.no_grad():
                for p, risk in zip(others, risks):
                    self.pair_weights[q, p] *= torch.exp(eta * weights[p] * risk.detach())
        return total / domains

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        if len(minibatches) != self.num_domains:
            raise DomaingenError(f"TRM was built for {self.num_domains} training domains but got {len(minibatches)} minibatches")
        x = torch.cat([xb for xb, _ in minibatches])
        y = torch.cat([yb for _, yb in minibatches])
        features = self.featurizer(x)
        nll = classification_loss(self.classifier(features), y)
        loss = nll
        if self.update_count.item() >= int(self.hparams["iters"]):
            self.pair_weights /= self.pair_weights.sum(dim=1, keepdim=True)
            labels = [yb for _, yb in minibatches]
            with torch.autocast(x.device.type, enabled=False):
                split = list(torch.split(features.float(), [len(yb) for yb in labels]))
                loss = nll + self.transfer_loss(split, labels)
        self.step(loss)
        self.update_count += 1
        return {"loss": loss.item(), "nll": nll.item(), "trm_loss": loss.item() - nll.item()}
