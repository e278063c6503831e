"""DigitMLP: Csordás et al.'s feedforward network for digit answers, head included (ICLR 2021).

The network (their `FeedforwardModel`) is Linear layers of `layer_sizes` with ReLU between
them and a last Linear layer with one 10-way logit group per answer digit: `slots` answers of
`digits` digits each, least significant digit first. Weights are Xavier-normal (ReLU gain; gain
1 for the last layer), biases zero, as in their code.

Its output is not the digit logits but, for the answer it reads, the log-probability of every
number 0 .. 10**digits - 1 under independent per-digit softmaxes:
log p(n) = sum_k log_softmax(logits_k)[digit_k(n)]. These log-probabilities sum to one in
probability, so the standard cross-entropy of the number is the sum of the per-digit
cross-entropies (the paper's loss, up to its mean over digits), and the arg-max number is the
number of the per-digit arg-maxes (an example is correct when every digit is). The algorithms'
loss and accuracy therefore apply unchanged; the head `classifier` of the algorithm is the
identity (`includes_head`).

With several answer slots (double addition: one answer per pair of numbers) the input is
`slots` equal blocks and an example shows one pair, the other blocks zero, as the paper's
feedforward runs show the network one pair at a time; the answer read is that of the block
with any non-zero input.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from domaingen.errors import DomaingenError

BASE = 10


def parse_layer_sizes(value: Any) -> tuple[int, ...]:
    """'400,400,200' (or a sequence of ints) -> (400, 400, 200); refuses an empty or non-positive size in one line."""
    try:
        sizes = tuple(int(v) for v in (str(value).split(",") if isinstance(value, str) else value))
    except (TypeError, ValueError):
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise DomaingenError(f"layer_sizes must be positive integers separated by commas (e.g. 400,400,200), got {value!r}")
    return sizes


def digit_log_probs_to_numbers(logits: torch.Tensor) -> torch.Tensor:
    """[N, digits, 10] per-digit logits (least significant first) -> [N, 10**digits] log p(number)."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    joint = log_probs[:, 0]
    for k in range(1, log_probs.shape[1]):
        # number d_k * 10**k + rest: the new digit is the slower index
        joint = (log_probs[:, k, :, None] + joint[:, None, :]).flatten(1)
    return joint


def shown_slot(x: torch.Tensor, slots: int) -> torch.Tensor:
    """Per example, the index of the input block (of `slots` equal blocks) with any non-zero entry."""
    return x.reshape(x.shape[0], slots, -1).abs().sum(-1).argmax(1)


class DigitMLP(nn.Module):
    """Linear/ReLU layers of `layer_sizes`, a digit-logit layer, and the per-number log-probabilities (module docstring)."""

    includes_head = True

    def __init__(self, n_inputs: int, layer_sizes: Sequence[int], digits: int, slots: int = 1) -> None:
        super().__init__()
        if digits < 1 or slots < 1:
            raise DomaingenError(f"DigitMLP needs at least one answer digit and one slot, got digits={digits}, slots={slots}")
        if n_inputs % slots:
            raise DomaingenError(f"DigitMLP's {n_inputs} inputs do not split into {slots} equal blocks, one per answer slot")
        self.digits, self.slots = int(digits), int(slots)
        sizes = [n_inputs, *layer_sizes, self.slots * self.digits * BASE]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.relus = nn.ModuleList(nn.ReLU() for _ in layer_sizes)
        for i, layer in enumerate(self.layers):
            last = i == len(self.layers) - 1
            nn.init.xavier_normal_(layer.weight, gain=1.0 if last else nn.init.calculate_gain("relu"))
            nn.init.zeros_(layer.bias)
        self.n_outputs = BASE ** self.digits

    def digit_logits(self, x: torch.Tensor) -> torch.Tensor:
        """[N, slots, digits, 10]: the last layer's logits of every answer slot."""
        h = x.flatten(1)
        for layer, relu in zip(self.layers[:-1], self.relus):
            h = relu(layer(h))
        return self.layers[-1](h).view(h.shape[0], self.slots, self.digits, BASE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.digit_logits(x)
        if self.slots == 1:
            answer = logits[:, 0]
        else:
            answer = logits[torch.arange(len(logits), device=logits.device), shown_slot(x, self.slots)]
        return digit_log_probs_to_numbers(answer)


def build_digit_mlp(input_shape: Sequence[int], hparams: Mapping[str, Any]) -> nn.Module:
    """The FEATURIZERS entry `DigitMLP`: hparams `layer_sizes`, `answer_digits`, `answer_slots`."""
    return DigitMLP(math.prod(input_shape), parse_layer_sizes(hparams.get("layer_sizes", "400,400,200")),
                    int(hparams.get("answer_digits", 2)), int(hparams.get("answer_slots", 1)))
