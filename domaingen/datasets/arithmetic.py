"""Csordás et al.'s arithmetic tasks (ICLR 2021, "Are Neural Nets Modular?"), as multi-domain datasets.

Synthetic, built in memory, with the encoding of the paper's public code
(github.com/RobertCsordas/modules, `dataset/double_op.py`, `dataset/tuple_arithmetic.py` and their
feedforward interfaces):

- a number below 10**DIGITS is its DIGITS decimal digits, least significant first, each one-hot
  over 10 values;
- `AddMul` (environments `add`, `mul`, `add+mul`): operands a, b uniform in [0, 10**DIGITS), the input the
  digits of a, then of b, then a one-hot operation (add, mul): 2 * DIGITS * 10 + 2 inputs (42 for
  two digits); the answer (a + b) or (a * b) mod MODULUS;
- `DoubleAddition` (environments `pair1`, `pair2`, `pair1+pair2`): two pairs of numbers, each added mod MODULUS.
  As the paper's feedforward runs show the network one pair at a time (the other pair's inputs
  zero) and read that pair's answer, an example of environment `pairK` is pair K alone: the
  input is 2 blocks of 2 * DIGITS * 10, block K the pair's digits, the other block zero
  (80 inputs for two digits), and the answer its sum.

Each dataset has a third environment that mixes the two tasks (alternate examples), for the
held-out test set: `--test_envs 2` trains on both tasks as the paper does, and `diagnose
--domain_masks` then trains one mask per task.

The answer is the class, a number below 10**DIGITS (NUM_CLASSES); the `DigitMLP` featurizer
(networks/digits.py) turns its DIGITS x 10 output logits per answer slot (20 for two digits; 40
for double addition's two slots) into the log-probability of each number, so the standard
cross-entropy is the per-digit cross-entropy the paper trains with, and accuracy counts an answer
right when every digit is. The network is the paper's "small" feedforward one (hidden layers
400, 400, 200; `layer_sizes`); its "medium" one is `--hparams '{"layer_sizes": "800,800,800,800"}'`.

Every size is a class constant (MODULUS, DIGITS, N_PER_ENV, DATA_SEED), part of `data_source`;
change them in a plugin subclass. Sizes no answer can hold are refused in one line before a run
writes anything.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

import torch
import torch.nn.functional as F

from domaingen.datasets.base import DATASETS, Environment, MultiDomainDataset
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, int_pow2_uniform, log_uniform

BASE = 10
MAX_DIGITS = 4  # the head scores every number below 10**DIGITS

ARITHMETIC_HPARAMS: dict[str, HParam] = {
    "lr": HParam(1e-3, log_uniform(-4.5, -2.5), "learning rate (Adam)"),
    "batch_size": HParam(128, int_pow2_uniform(5, 9), "examples per training environment per step"),
    "featurizer": HParam("DigitMLP", help="DigitMLP: the paper's feedforward network with its digit head"),
    "layer_sizes": HParam("400,400,200", help="DigitMLP's hidden layers (the paper's small network; medium: "
                                               "800,800,800,800)"),
}


def digits_of(numbers: torch.Tensor, n_digits: int) -> torch.Tensor:
    """[...] non-negative integers -> [..., n_digits] decimal digits, least significant first."""
    powers = BASE ** torch.arange(n_digits, dtype=torch.long)
    return (numbers.long().unsqueeze(-1) // powers) % BASE


def one_hot_numbers(numbers: torch.Tensor, n_digits: int) -> torch.Tensor:
    """[N, k] numbers -> [N, k * n_digits * 10] uint8: each number's digits one-hot, in order."""
    return F.one_hot(digits_of(numbers, n_digits), BASE).flatten(1).to(torch.uint8)


class ArithmeticBase(MultiDomainDataset):
    """Shared sizes, checks and hyperparameters of Csordás et al.'s arithmetic tasks (module docstring)."""

    MODULUS: ClassVar[int] = 100
    DIGITS: ClassVar[int] = 2
    N_PER_ENV: ClassVar[int] = 50000  # drawn with replacement: the out split's pairs are nearly all seen in training, as in the paper (1e6 training draws)
    DATA_SEED: ClassVar[int] = 0
    ANSWER_SLOTS: ClassVar[int] = 1
    READS_DATA_DIR = False
    N_STEPS = 5001
    CHECKPOINT_FREQ = 500
    HPARAMS = ARITHMETIC_HPARAMS

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.set_shapes()

    @classmethod
    def set_shapes(cls) -> None:
        """INPUT_SHAPE and NUM_CLASSES from the sizes (left as they are for sizes check_parameters refuses)."""
        if isinstance(cls.DIGITS, int) and 1 <= cls.DIGITS <= MAX_DIGITS:
            cls.INPUT_SHAPE = (cls.input_size(),)
            cls.NUM_CLASSES = BASE ** cls.DIGITS

    @classmethod
    def input_size(cls) -> int:
        """Inputs of one example."""
        raise NotImplementedError

    @classmethod
    def check_parameters(cls) -> None:
        """Refuse sizes no answer can hold, in one line that says which constant to change."""
        name = cls.__name__
        for key in ("DIGITS", "N_PER_ENV"):
            if not isinstance(getattr(cls, key), int) or getattr(cls, key) < 1:
                raise DomaingenError(f"{name}.{key} must be a positive integer, got {getattr(cls, key)!r}")
        if cls.DIGITS > MAX_DIGITS:
            raise DomaingenError(f"{name}.DIGITS={cls.DIGITS} is more digits than the output allows: the head scores "
                                 f"every number below 10**DIGITS; use DIGITS <= {MAX_DIGITS}")
        if not isinstance(cls.MODULUS, int) or cls.MODULUS < 2:
            raise DomaingenError(f"{name}.MODULUS must be an integer of at least 2, got {cls.MODULUS!r}")
        if cls.MODULUS > BASE ** cls.DIGITS:
            raise DomaingenError(f"{name}.MODULUS={cls.MODULUS} has answers of more digits than the output's "
                                 f"DIGITS={cls.DIGITS}; use MODULUS <= {BASE ** cls.DIGITS} or more DIGITS")

    @classmethod
    def resolve_test_envs(cls, tokens: Sequence[int | str]) -> list[int]:
        cls.check_parameters()
        return super().resolve_test_envs(tokens)

    @classmethod
    def hparam_space(cls) -> dict[str, HParam]:
        """The shared hyperparameters plus the digit head's layout, fixed by the class constants."""
        return {**super().hparam_space(),
                "answer_digits": HParam(cls.DIGITS, help="digits of an answer (the dataset's DIGITS)"),
                "answer_slots": HParam(cls.ANSWER_SLOTS, help="answers the network outputs (the dataset's slots)")}

    def describe(self) -> str:
        """The generator and its sizes (the `data_source` of every record)."""
        return (f"csordas-{type(self).__name__.lower()}(modulus={self.MODULUS},digits={self.DIGITS},"
                f"n={self.N_PER_ENV},seed={self.DATA_SEED})")

    def __init__(self, data_dir: str, test_envs: Sequence[int], hparams: Mapping[str, Any]) -> None:
        super().__init__(data_dir, test_envs, hparams)
        self.check_parameters()
        self.data_source = self.describe()
        for i, name in enumerate(self.ENVIRONMENTS):
            generator = torch.Generator().manual_seed(self.DATA_SEED * 1000 + i + 1)
            operands = torch.randint(0, BASE ** self.DIGITS, (self.N_PER_ENV, 2), generator=generator)
            # the last environment mixes both tasks, alternately
            task = torch.arange(self.N_PER_ENV) % 2 if i == 2 else torch.full((self.N_PER_ENV,), i)
            x, y = self.encode(task, operands)
            self.environments.append(Environment(str(name), x, y, scale=1.0))

    def encode(self, task: torch.Tensor, operands: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(uint8 inputs, answers) of [N, 2] operands, example n posing task[n] (0 or 1: the first
        two environments' tasks)."""
        raise NotImplementedError


@DATASETS.register("AddMul")
class AddMul(ArithmeticBase):
    """Addition and multiplication modulo 100 in one network (Csordás et al., ICLR 2021): environments add, mul, and both mixed."""

    ENVIRONMENTS = ("add", "mul", "add+mul")

    @classmethod
    def input_size(cls) -> int:
        return 2 * cls.DIGITS * BASE + 2

    def encode(self, task: torch.Tensor, operands: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = operands[:, 0], operands[:, 1]
        answer = torch.where(task == 0, a + b, a * b) % self.MODULUS
        op = F.one_hot(task.long(), 2).to(torch.uint8)
        return torch.cat([one_hot_numbers(operands, self.DIGITS), op], 1), answer




@DATASETS.register("DoubleAddition")
class DoubleAddition(ArithmeticBase):
    """Two additions modulo 100, one answer per pair (Csordás et al.'s P_reuse test): environments pair1, pair2, both mixed."""

    ENVIRONMENTS = ("pair1", "pair2", "pair1+pair2")
    ANSWER_SLOTS = 2

    @classmethod
    def input_size(cls) -> int:
        return 2 * 2 * cls.DIGITS * BASE

    def encode(self, task: torch.Tensor, operands: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        block = one_hot_numbers(operands, self.DIGITS)
        blocks = [block * (task == k).to(block.dtype).unsqueeze(1) for k in range(2)]
        return torch.cat(blocks, 1), (operands[:, 0] + operands[:, 1]) % self.MODULUS


