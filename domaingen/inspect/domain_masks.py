"""Which weights each training domain uses: Csordás et al.'s weight masks (ICLR 2021), one per domain.

The trained weights are frozen; every Linear and Conv2d weight gets a logit, and a mask
is trained on one domain's data alone: the network computes with w * b, b a hard
Gumbel-sigmoid sample of sigmoid(logit) with the straight-through gradient (the ModReg
mask code of domaingen.masks), and the loss is the cross-entropy plus alpha times the
sum of the logits, which pushes every weight the domain does not need out of the mask.
The kept weights are then logit > 0. Comparing the domains' masks per layer says which
weights all domains share and how much each pair overlaps (IoU).

Csordás et al.'s tests of reuse and specialisation (`diagnose --domain_masks`): each domain's
mask applied to every environment (a mask that keeps its accuracy on another domain means
that domain is served by the same weights), the inverted mask (only the weights the mask
removed: a domain that still works without its mask's weights was not specialised to them),
the asymmetric sharing s(t, r) = |M_t & M_r| / |M_t| (the share of t's weights that r keeps
too), and a control mask trained on every training domain at the same strength alpha
(`--mask_alpha`). The paper calibrates the strength with such a control: a mask trained on the
whole task should keep the unmasked accuracy; when the control loses accuracy, alpha is too
strong and the per-domain masks drop weights for the regulariser's sake, not the domain's.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from domaingen.errors import DomaingenError
from domaingen.masks import DEFAULT_INIT_LOGIT, gumbel_sigmoid

MASK_LR = 1e-2  # Adam learning rate of the mask logits
# Weight of the sum-of-logits regulariser against the mean loss. The authors' trainer divides its
# mask_loss_weight by the batch size, so their per-logit weights are 1e-4 / 128 = 7.8e-7 against a
# mean per-digit loss (arithmetic; 1.5625e-6 against DigitMLP's loss, the sum over its two digits),
# 3e-4 / 128 = 2.3e-6 (CIFAR-10) and 1.28e-3 / 128 = 1e-5 (permuted MNIST); 1e-5 is ours.
MASK_ALPHA = 1e-5
SEED_STRIDE = 1000  # mask d of mask seed s draws from seed s * SEED_STRIDE + d


def maskable_weights(model: nn.Module) -> dict[str, nn.Parameter]:
    """The weights of every Linear and Conv2d layer of `model` (subclasses included), by parameter name."""
    return {f"{name}.weight" if name else "weight": m.weight for name, m in model.named_modules()
            if isinstance(m, (nn.Linear, nn.Conv2d))}


def mask_overlap(masks: torch.Tensor) -> dict[str, object]:
    """Statistics of D binary masks over one layer's weights, `masks` [D, weights] (True = kept).

    kept_fraction: per domain, its kept share of the weights; shared_fraction: of the weights
    some domain keeps, the share that every domain keeps (NaN when none is kept); iou: the
    [D, D] matrix |a & b| / |a | b| (NaN for two empty masks).
    """
    m = masks.bool()
    union_all = m.any(0).sum()
    shared = m.all(0).sum()
    inter = (m[:, None, :] & m[None, :, :]).sum(-1).double()
    union = (m[:, None, :] | m[None, :, :]).sum(-1).double()
    return {
        "kept_fraction": [float(v) for v in m.double().mean(1)],
        "shared_fraction": float(shared / union_all) if union_all > 0 else float("nan"),
        "iou": (inter / union).tolist(),
    }


def check_mask_options(num_train_domains: int, alpha: float, seeds: Sequence[int] = ()) -> None:
    """Refuse, in one line, domain masks that cannot be compared, a strength that is not positive,
    or mask seeds that are negative or repeat."""
    if num_train_domains < 2:
        raise DomaingenError(f"--domain_masks compares the masks of the training domains, but this run has "
                             f"{num_train_domains}; use a run that holds out fewer environments")
    if not alpha > 0:
        raise DomaingenError(f"--mask_alpha must be positive, got {alpha}")
    if any(int(v) < 0 for v in seeds) or len(set(seeds)) != len(seeds):
        raise DomaingenError(f"--mask_seed takes distinct non-negative integers, got {' '.join(map(str, seeds))}")


def weight_ratios(kept: Sequence[int]) -> list[list[float]]:
    """[D, D] kept[t] / kept[r]: how many times the weights of mask r mask t keeps (NaN for an empty r)."""
    return [[t / r if r else float("nan") for r in kept] for t in kept]


def mask_iou(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a & b| / |a | b| of two binary masks (NaN when both are empty)."""
    union = int((a.bool() | b.bool()).sum())
    return int((a.bool() & b.bool()).sum()) / union if union else float("nan")


def seed_stability(domains: Sequence[str], seeds: Sequence[int], masks: Sequence[Sequence[Mapping[str, torch.Tensor]]],
                   layer_names: Mapping[str, str]) -> dict[str, object]:
    """How alike one domain's masks of different mask seeds are.

    `masks[i][d]` is mask seed seeds[i]'s mask of domain d, by weight name; `layer_names` maps
    a weight name to its layer's name in the report. Per domain: the IoU over all masked weights
    of every pair of seeds (`pairs`, in order (0, 1), (0, 2), ..., (1, 2), ...), their mean and
    standard deviation (ddof 0; NaN for none), and per layer the mean IoU over the pairs.
    """
    pairs = [(i, j) for i in range(len(seeds)) for j in range(i + 1, len(seeds))]
    per_domain = {}
    for d, domain in enumerate(domains):
        whole = [torch.cat([m[d][n].flatten().cpu() for n in layer_names]) for m in masks]
        ious = [mask_iou(whole[i], whole[j]) for i, j in pairs]
        values = torch.tensor(ious, dtype=torch.float64)
        per_domain[domain] = {
            "pairs": ious,
            "mean": float(values.mean()) if ious else float("nan"),
            "std": float(values.std(unbiased=False)) if ious else float("nan"),
            "layers": {layer: float(torch.tensor([mask_iou(masks[i][d][n], masks[j][d][n]) for i, j in pairs],
                                                 dtype=torch.float64).mean())
                       for n, layer in layer_names.items()},
        }
    return {"seeds": [int(v) for v in seeds], "pairs": [[seeds[i], seeds[j]] for i, j in pairs], "domains": per_domain}


def mask_sharing(masks: torch.Tensor) -> list[list[float]]:
    """[D, D] asymmetric sharing s(t, r) = |M_t & M_r| / |M_t| of D binary masks `masks` [D, weights]
    (the share of t's kept weights that r keeps too; NaN for an empty M_t)."""
    m = masks.bool()
    inter = (m[:, None, :] & m[None, :, :]).sum(-1).double()
    own = m.sum(1).double().unsqueeze(1)
    return (inter / own).tolist()


def train_mask_logits(
    forward: Callable[[Mapping[str, torch.Tensor], torch.Tensor], torch.Tensor],
    weights: Mapping[str, torch.Tensor],
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    steps: int,
    lr: float = MASK_LR,
    alpha: float = MASK_ALPHA,
    init_logit: float = DEFAULT_INIT_LOGIT,
) -> dict[str, torch.Tensor]:
    """Train one weight mask on frozen `weights`; returns its logits by name, detached (sigmoid: the
    keep probabilities; the kept weights are logit > 0, `masks.eval_mask`).

    `forward(masked_weights, x)` computes logits with the given weights in place of the
    model's; `batches` yields (x, y) of one domain.
    """
    logits = {name: torch.full_like(w, init_logit, requires_grad=True) for name, w in weights.items()}
    optimizer = torch.optim.Adam(logits.values(), lr=lr)
    frozen = {name: w.detach() for name, w in weights.items()}
    for _ in range(steps):
        x, y = next(batches)
        masked = {name: frozen[name] * gumbel_sigmoid(logits[name]) for name in frozen}
        loss = loss_fn(forward(masked, x), y) + alpha * sum(l.sum() for l in logits.values())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return {name: l.detach() for name, l in logits.items()}


def masked_accuracy(
    forward: Callable[[Mapping[str, torch.Tensor], torch.Tensor], torch.Tensor],
    weights: Mapping[str, torch.Tensor],
    masks: Mapping[str, torch.Tensor],
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
) -> float:
    """Accuracy of the network whose weights are `weights` times the binary `masks`, over `batches`."""
    masked = {name: w.detach() * masks[name].to(w.dtype) for name, w in weights.items()}
    correct = total = 0
    with torch.no_grad():
        for x, y in batches:
            logits = forward(masked, x)
            predicted = (logits[:, 0] > 0).long() if logits.shape[1] == 1 else logits.argmax(1)
            correct += int((predicted.cpu() == y.cpu()).sum())
            total += len(y)
    return correct / total if total else float("nan")
