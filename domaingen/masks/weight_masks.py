"""Per-weight Gumbel-sigmoid masks (ModReg; reusable for Csordás-style domain masks).

They follow Csordás et al. (ICLR 2021): every weight w of a Linear or
Conv2d layer has a logit l; during training the layer uses w * b with
b = 1[s > 0.5], s = sigmoid((l - log(log U1 / log U2)) / tau), U1, U2 ~ U(0, 1),
and the straight-through gradient of s, so E[b] = sigmoid(l). The batch is cut
into `groups` interleaved groups (example n belongs to group n mod groups), each
with its own mask sample: a Linear layer runs one GEMM per group over a strided
view of the group's rows, a Conv2d one grouped convolution; neither copies the batch.
In eval mode the mask is the deterministic 1[sigmoid(l) > 0.5].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from domaingen.errors import DomaingenError

DEFAULT_INIT_LOGIT = 2.0  # sigmoid(2) = 0.881 (ours); Csordás et al. start at 0.9 = sigmoid(2.197)


def _logistic_noise(like: torch.Tensor) -> torch.Tensor:
    """Logistic(0, 1) samples, log u - log(1 - u).

    This is the distribution of log(log U1 / log U2), the difference of two Gumbel
    samples in Csordás et al.'s formula, drawn from one uniform instead of two.
    """
    u = torch.rand_like(like).clamp_(1e-7, 1 - 1e-7)
    return torch.log(u).sub_(torch.log1p(-u))


class _HardGumbelSigmoidTau1(torch.autograd.Function):
    """The tau = 1 case without transcendental functions per sample.

    With u ~ U(0, 1), noise = logit(u) and pi = sigmoid(l): l - noise > 0 iff u < pi,
    and s = sigmoid(l - noise) = pi (1 - u) / D with D = pi + u (1 - 2 pi), so the
    straight-through slope is ds/dl = pi (1 - pi) u (1 - u) / D^2. Only pi needs a
    sigmoid, once per weight rather than once per sample.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, samples: int) -> torch.Tensor:  # type: ignore[override]
        pi = torch.sigmoid(logits)
        u = torch.rand((samples, *logits.shape), dtype=logits.dtype, device=logits.device).clamp_(1e-7, 1 - 1e-7)
        hard = (u < pi).to(logits.dtype)
        denominator = torch.addcmul(pi, u, 1 - 2 * pi)
        slope = torch.addcmul(u, u, u, value=-1.0).div_(denominator.square_()).mul_(pi * (1 - pi))
        ctx.save_for_backward(slope)
        return hard

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (slope,) = ctx.saved_tensors
        return (grad * slope).sum(dim=0), None


class _HardGumbelSigmoid(torch.autograd.Function):
    """1[l - noise > 0] forward; the gradient of sigmoid((l - noise) / tau) backward (straight-through).

    Written as one function so that only the slope s(1 - s)/tau is kept for
    backward: mask sampling runs over every weight each step and is memory-bound.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, tau: float) -> torch.Tensor:  # type: ignore[override]
        z = logits - _logistic_noise(logits)
        hard = (z > 0).to(logits.dtype)
        soft = torch.sigmoid_(z.div_(tau))
        ctx.save_for_backward(soft.mul_(1 - soft).div_(tau))
        return hard

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (slope,) = ctx.saved_tensors
        return grad * slope, None


def gumbel_sigmoid(logits: torch.Tensor, tau: float = 1.0, hard: bool = True) -> torch.Tensor:
    """A relaxed Bernoulli(sigmoid(logits)) sample, s = sigmoid((l - log(log U1 / log U2)) / tau).

    `hard` gives 0/1 values, 1[s > 0.5], with the gradient of s (straight-through).
    """
    if hard:
        return _HardGumbelSigmoid.apply(logits, float(tau))
    return torch.sigmoid((logits - _logistic_noise(logits)) / tau)


def sample_hard_masks(logits: torch.Tensor, samples: int, tau: float = 1.0) -> torch.Tensor:
    """`samples` independent hard Gumbel-sigmoid masks of `logits`, stacked on dim 0 (straight-through)."""
    if tau == 1.0:
        return _HardGumbelSigmoidTau1.apply(logits, int(samples))
    return gumbel_sigmoid(logits.unsqueeze(0).expand(samples, *logits.shape), tau)


def eval_mask(logits: torch.Tensor) -> torch.Tensor:
    """The deterministic mask 1[sigmoid(l) > 0.5] = 1[l > 0]."""
    return (logits > 0).to(logits.dtype)


def _pad_to_multiple(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, int]:
    n = x.shape[0]
    padded = -(-n // groups) * groups
    if padded == n:
        return x, n
    return torch.cat([x, x.new_zeros((padded - n, *x.shape[1:]))]), n


class _WeightMasked:
    """Mixin for a layer whose weight is multiplied by a learned binary mask."""

    weight: nn.Parameter
    mask_logits: nn.Parameter
    groups_per_batch: int
    tau: float

    def init_mask(self, groups: int, init_logit: float, tau: float, mask_bias: bool) -> None:
        if groups < 1:
            raise DomaingenError(f"mask groups must be at least 1, got {groups}")
        self.groups_per_batch = int(groups)
        self.tau = float(tau)
        self.mask_logits = nn.Parameter(torch.full_like(self.weight, float(init_logit)))
        self.bias_mask_logits = None
        if mask_bias and getattr(self, "bias", None) is not None:
            self.bias_mask_logits = nn.Parameter(torch.full_like(self.bias, float(init_logit)))

    def sample_masks(self, logits: torch.Tensor) -> torch.Tensor:
        """`groups` independent hard samples stacked on dim 0."""
        return sample_hard_masks(logits, self.groups_per_batch, self.tau)

    def masked_bias(self, n_groups: int | None) -> torch.Tensor | None:
        bias = getattr(self, "bias", None)
        if bias is None or self.bias_mask_logits is None:
            return bias
        if n_groups is None:
            return bias * eval_mask(self.bias_mask_logits)
        return bias * self.sample_masks(self.bias_mask_logits)


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast computes matmuls in on `device_type`, or None when autocast is off there."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 takes no device type
        enabled = torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()
        return (torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()) if enabled else None
    return torch.get_autocast_dtype(device_type) if enabled else None


class _InterleavedGroupLinear(torch.autograd.Function):
    """x @ W[g].T + b[g] for the rows of group g = row mod k, without regrouping the rows.

    The rows of group g form a strided view of x (leading dimension k * in), which a
    GEMM reads as it is and writes into the matching strided view of the output; a
    batched matmul over groups would first copy them into group-major order, and the
    copies cost as much as the matmuls on large (full-batch) inputs. `bias` is None,
    one bias [out] for every group, or one per group [k, out].
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:  # type: ignore[override]
        k, n_out, n_in = weights.shape
        rows = x.view(-1, k, n_in)
        out = x.new_empty(rows.shape[0], k, n_out)
        for g in range(k):
            if bias is None:
                torch.mm(rows[:, g], weights[g].t(), out=out[:, g])
            else:
                torch.addmm(bias[g] if bias.dim() == 2 else bias, rows[:, g], weights[g].t(), out=out[:, g])
        ctx.save_for_backward(x, weights)
        ctx.bias_shape = None if bias is None else bias.shape
        return out.view(-1, n_out)

    @staticmethod
    @once_differentiable  # the out= matmuls below record no graph: a second derivative is an error, not a wrong 0
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # type: ignore[override]
        x, weights = ctx.saved_tensors
        k, n_out, n_in = weights.shape
        grad_rows = grad.contiguous().view(-1, k, n_out)
        rows = x.view(-1, k, n_in)
        grad_x = x.new_empty(rows.shape)
        grad_weights = torch.empty_like(weights)
        for g in range(k):
            torch.mm(grad_rows[:, g], weights[g], out=grad_x[:, g])
            torch.mm(grad_rows[:, g].t(), rows[:, g], out=grad_weights[g])
        grad_bias = None
        if ctx.bias_shape is not None:
            grad_bias = grad_rows.sum(dim=0)  # [k, out]: one row per group's bias
            if len(ctx.bias_shape) == 1:
                grad_bias = grad_bias.sum(dim=0)
        return grad_x.view(-1, n_in), grad_weights, grad_bias


class MaskedLinear(nn.Linear, _WeightMasked):
    """nn.Linear with a per-weight Gumbel-sigmoid mask (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.linear(x, self.weight * eval_mask(self.mask_logits), self.masked_bias(None))
        k = self.groups_per_batch
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1])
        flat, n = _pad_to_multiple(flat, k)
        weights = self.weight * self.sample_masks(self.mask_logits)  # [k, out, in]
        bias = self.masked_bias(k)
        # explicit out= matmuls are outside autocast's reach: cast as F.linear would be
        dtype = _autocast_dtype(flat.device.type) or torch.promote_types(flat.dtype, weights.dtype)
        out = _InterleavedGroupLinear.apply(
            flat.contiguous().to(dtype), weights.to(dtype), None if bias is None else bias.to(dtype)
        )
        if n < out.shape[0]:
            out = out[:n]
        return out.reshape(*lead, out.shape[-1])


class MaskedConv2d(nn.Conv2d, _WeightMasked):
    """nn.Conv2d with a per-weight Gumbel-sigmoid mask; groups of the batch run as one grouped conv."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return self._conv_forward(x, self.weight * eval_mask(self.mask_logits), self.masked_bias(None))
        if self.groups != 1:
            raise DomaingenError("weight masks support only ungrouped convolutions (groups=1)")
        k = self.groups_per_batch
        x, n = _pad_to_multiple(x, k)
        c_in, h, w = x.shape[1:]
        weights = self.weight * self.sample_masks(self.mask_logits)  # [k, out, in, kh, kw]
        bias = self.masked_bias(k)
        if bias is not None and bias.dim() == 1:
            bias = bias.repeat(k)
        # example n*k + g sits in channel block g of row n: a free view of contiguous NCHW
        stacked = x.contiguous().view(-1, k * c_in, h, w)
        out = F.conv2d(
            stacked, weights.reshape(-1, *weights.shape[2:]), bias.reshape(-1) if bias is not None else None,
            self.stride, self.padding, self.dilation, groups=k,
        )
        out = out.reshape(-1, self.out_channels, *out.shape[2:])
        return out[:n]


def _convert(layer: nn.Module, groups: int, init_logit: float, tau: float, mask_bias: bool) -> nn.Module:
    if isinstance(layer, (MaskedLinear, MaskedConv2d)):
        return layer
    if type(layer) is nn.Linear:
        layer.__class__ = MaskedLinear
    elif type(layer) is nn.Conv2d:
        if layer.padding_mode != "zeros":
            raise DomaingenError(f"weight masks support only zero-padded convolutions, got {layer.padding_mode}")
        layer.__class__ = MaskedConv2d
    else:
        return layer
    layer.init_mask(groups, init_logit, tau, mask_bias)
    return layer


def add_weight_masks(
    model: nn.Module,
    groups: int = 4,
    init_logit: float = DEFAULT_INIT_LOGIT,
    tau: float = 1.0,
    mask_bias: bool = False,
) -> list[tuple[str, nn.Module]]:
    """Give every nn.Linear and nn.Conv2d in `model` a weight mask, in place.

    The layers keep their weight and bias Parameters (optimizers built later see
    them, plus the new `mask_logits`). Returns the masked layers with their names.
    Raises DomaingenError when the model has no maskable layer.
    """
    masked = []
    for name, module in model.named_modules():
        if type(module) in (nn.Linear, nn.Conv2d, MaskedLinear, MaskedConv2d):
            masked.append((name, _convert(module, groups, init_logit, tau, mask_bias)))
    if not masked:
        raise DomaingenError(
            f"ModReg found no layer to mask in {type(model).__name__}: weight masks need nn.Linear or nn.Conv2d layers"
        )
    return masked


def masked_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The (name, layer) pairs of `model` that carry a weight mask."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (MaskedLinear, MaskedConv2d))]


def weight_mask_logits(model: nn.Module) -> list[nn.Parameter]:
    """Every weight-mask logit tensor of `model` (weights' and, if masked, biases'), in module order."""
    params = []
    for _, layer in masked_layers(model):
        params.append(layer.mask_logits)
        if layer.bias_mask_logits is not None:
            params.append(layer.bias_mask_logits)
    return params


def outgoing_sums(values: torch.Tensor) -> torch.Tensor:
    """Per input feature p, the sum of `values` over the weights leaving p (W[:, p] or W[:, p, :, :])."""
    dims = [0] + list(range(2, values.dim()))
    return values.sum(dim=dims)


def specialization_penalty(logits: torch.Tensor) -> torch.Tensor:
    """S1 of one layer: sum over input features p of (sum of pi over the weights leaving p)^2."""
    return outgoing_sums(torch.sigmoid(logits)).square().sum()


def reuse_penalty(logits: torch.Tensor) -> torch.Tensor:
    """S2 of one layer: sum over input features p of sqrt(sum of pi^2 over the weights leaving p)."""
    return outgoing_sums(torch.sigmoid(logits).square()).sqrt().sum()


KEEP_PROB_QUANTILES = (10, 50, 90)


@dataclass
class SubnetworkStats:
    """What the deterministic mask keeps of one layer, and where its keep probabilities sigmoid(l) lie.

    The probabilities show logits moving toward 0 before any weight is dropped.
    """

    kept_fraction: float
    inputs_kept: int
    inputs_total: int
    keep_prob_mean: float
    keep_prob_quantiles: dict[int, float]  # percentile -> value, for KEEP_PROB_QUANTILES


def subnetwork_stats(layer: nn.Module) -> SubnetworkStats:
    """Kept-weight fraction, input features with any kept outgoing weight, and the mean and
    10/50/90th percentiles (linear interpolation) of sigmoid(logit) over the layer's weights."""
    with torch.no_grad():
        mask = eval_mask(layer.mask_logits)
        per_input = outgoing_sums(mask)
        probs = torch.sigmoid(layer.mask_logits.detach().double()).flatten().cpu().numpy()
        quantiles = np.percentile(probs, KEEP_PROB_QUANTILES)
        return SubnetworkStats(
            float(mask.mean()),
            int((per_input > 0).sum()),
            int(per_input.numel()),
            float(probs.mean()),
            {q: float(v) for q, v in zip(KEEP_PROB_QUANTILES, quantiles)},
        )
