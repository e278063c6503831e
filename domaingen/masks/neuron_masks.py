"""Per-domain neuron masks (DMG, Chattopadhyay et al., ECCV 2020).

DMG gives every training domain one logit per neuron (or channel) of a few
layers' inputs. Training multiplies each example's activations by a Bernoulli
sample of its own domain's mask, with the straight-through gradient to the
probabilities; a soft-IoU penalty keeps the domains' masks from overlapping
completely. The penalty is the paper's sum over layers and domain pairs
(reduction "sum"), or the sum over layers of the mean over domain pairs
(reduction "mean", what the authors' public code computes). An optional L1
sparsity penalty, the sum of every keep probability, pushes masks to drop neurons.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from domaingen.errors import DomaingenError

IOU_EPS = 1e-8
# how the soft IoU of the domain pairs of one layer is reduced before summing over layers
OVERLAP_REDUCTIONS = ("sum", "mean")


def pairwise_soft_iou(masks: torch.Tensor, eps: float = IOU_EPS) -> torch.Tensor:
    """The [D, D] soft IoU of every pair of rows of a [D, C] mask matrix: for rows a and b,
    (sum a*b + eps) / (sum (a + b - a*b) + eps). For {0, 1} masks this is the ordinary
    intersection over union (two empty masks: 1)."""
    # elementwise, not a matmul: bf16 autocast leaves it in the masks' precision
    inter = (masks[:, None, :] * masks[None, :, :]).sum(-1)
    sizes = masks.sum(1)
    union = sizes[:, None] + sizes[None, :] - inter
    return (inter + eps) / (union + eps)


def pair_soft_ious(masks: torch.Tensor, eps: float = IOU_EPS) -> torch.Tensor:
    """The soft IoU of each of the D*(D-1)/2 pairs (i < j) of rows of [D, C] masks, as a vector."""
    d = masks.shape[0]
    rows, cols = torch.triu_indices(d, d, offset=1, device=masks.device)
    return pairwise_soft_iou(masks, eps)[rows, cols]


def mean_pairwise_iou(masks: torch.Tensor, eps: float = IOU_EPS) -> torch.Tensor:
    """Mean soft IoU over the D*(D-1)/2 pairs of rows of [D, C] masks (0 when D < 2)."""
    if masks.shape[0] < 2:
        return masks.new_zeros(())
    return pair_soft_ious(masks, eps).mean()


def summed_pairwise_iou(masks: torch.Tensor, eps: float = IOU_EPS) -> torch.Tensor:
    """Sum of the soft IoU over the D*(D-1)/2 pairs of rows of [D, C] masks (0 when D < 2)."""
    if masks.shape[0] < 2:
        return masks.new_zeros(())
    return pair_soft_ious(masks, eps).sum()


def check_overlap_reduction(reduction: str, key: str = "reduction") -> str:
    """`reduction` if it is one of OVERLAP_REDUCTIONS, else a one-line DomaingenError naming `key`."""
    if reduction not in OVERLAP_REDUCTIONS:
        raise DomaingenError(f"{key} must be one of {', '.join(OVERLAP_REDUCTIONS)}, got {reduction!r}")
    return reduction


def straight_through_bernoulli(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """A {0, 1} sample of Bernoulli(probs) whose gradient w.r.t. probs is the identity."""
    hard = torch.bernoulli(probs.detach(), generator=generator)
    # (probs - probs.detach()) is exactly 0, so the forward value stays exactly {0, 1}
    return hard + (probs - probs.detach())


def neuron_mask_statistics(active: torch.Tensor) -> dict[str, float]:
    """Statistics of discrete [D, C] masks (True = neuron kept for that domain).

    iou: mean pairwise IoU over the pairs of domains whose masks are not both
    empty (NaN when there are none, or fewer than 2 domains); active: fraction of (domain, neuron)
    entries kept; shared: neurons kept by every domain; specific: kept by some
    but not all domains; unused: kept by none (the three counts sum to C).
    """
    active = active.bool()
    n_domains = active.shape[0]
    per_neuron = active.sum(0)
    return {
        "iou": _discrete_mean_iou(active),
        "active": float(active.float().mean()),
        "shared": int((per_neuron == n_domains).sum()),
        "specific": int(((per_neuron > 0) & (per_neuron < n_domains)).sum()),
        "unused": int((per_neuron == 0).sum()),
    }


def _discrete_mean_iou(active: torch.Tensor) -> float:
    n_domains = active.shape[0]
    if n_domains < 2:
        return float("nan")
    rows, cols = torch.triu_indices(n_domains, n_domains, offset=1)
    # eps 0: two empty masks give 0/0, left out rather than counted as identical
    return float(pairwise_soft_iou(active.float(), eps=0.0)[rows, cols].nanmean())


class DomainNeuronMasks(nn.Module):
    """One [num_domains, width] logit matrix per masked layer, initialised U(0, 1)."""

    def __init__(self, widths: Sequence[int], num_domains: int) -> None:
        super().__init__()
        self.num_domains = int(num_domains)
        self.logits = nn.ParameterList(nn.Parameter(torch.rand(self.num_domains, int(w))) for w in widths)

    def __len__(self) -> int:
        return len(self.logits)

    def probs(self) -> list[torch.Tensor]:
        """sigmoid(logits), one [D, C] matrix per layer."""
        return [torch.sigmoid(logit) for logit in self.logits]

    def overlap_penalty(self, reduction: str = "sum") -> torch.Tensor:
        """Soft IoU of the domains' probabilities, summed over layers. Within a layer the
        domain pairs are summed ("sum", the paper's equation) or averaged ("mean")."""
        per_pairs = summed_pairwise_iou if check_overlap_reduction(reduction) == "sum" else mean_pairwise_iou
        return torch.stack([per_pairs(p) for p in self.probs()]).sum()

    def sparsity_penalty(self) -> torch.Tensor:
        """The L1 norm of the keep probabilities: sigmoid(logits) summed over neurons, domains and layers."""
        return torch.stack([p.sum() for p in self.probs()]).sum()

    def statistics(self) -> list[dict[str, float]]:
        """`neuron_mask_statistics` of each layer's discrete masks, sigmoid(logit) > 0.5."""
        with torch.no_grad():
            return [neuron_mask_statistics(logit > 0) for logit in self.logits]
