"""Learned masks over a network: two mechanisms, two modules.

- `weight_masks`: a Gumbel-sigmoid mask over every weight of Linear and Conv2d layers
  (ModReg; Csordás et al.'s masks, reusable for per-domain weight masks);
- `neuron_masks`: per-domain masks over the neurons of a few layers' inputs (DMG).

The public names of both are re-exported here.
"""

from domaingen.masks.neuron_masks import (
    IOU_EPS,
    OVERLAP_REDUCTIONS,
    DomainNeuronMasks,
    mean_pairwise_iou,
    neuron_mask_statistics,
    pairwise_soft_iou,
    straight_through_bernoulli,
    summed_pairwise_iou,
)
from domaingen.masks.weight_masks import (
    DEFAULT_INIT_LOGIT,
    KEEP_PROB_QUANTILES,
    MaskedConv2d,
    MaskedLinear,
    SubnetworkStats,
    add_weight_masks,
    eval_mask,
    gumbel_sigmoid,
    masked_layers,
    outgoing_sums,
    reuse_penalty,
    sample_hard_masks,
    specialization_penalty,
    subnetwork_stats,
    weight_mask_logits,
)

__all__ = [
    "DEFAULT_INIT_LOGIT",
    "IOU_EPS",
    "KEEP_PROB_QUANTILES",
    "OVERLAP_REDUCTIONS",
    "DomainNeuronMasks",
    "MaskedConv2d",
    "MaskedLinear",
    "SubnetworkStats",
    "add_weight_masks",
    "eval_mask",
    "gumbel_sigmoid",
    "masked_layers",
    "mean_pairwise_iou",
    "neuron_mask_statistics",
    "outgoing_sums",
    "pairwise_soft_iou",
    "reuse_penalty",
    "sample_hard_masks",
    "specialization_penalty",
    "straight_through_bernoulli",
    "subnetwork_stats",
    "summed_pairwise_iou",
    "weight_mask_logits",
]
