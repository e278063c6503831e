"""Protocols: which experiment a run belongs to (`--protocol`, the spec key `protocol`).

When none is asked for, a run or sweep follows `domainbed` where DomainBed has its
algorithm and dataset (every one of a sweep's), else `paired` (`default_protocol`); a run
or sweep recorded without a protocol was `paired` (`RECORDED_DEFAULT`).

`paired` is domaingen's experiment for paired comparisons: a hyperparameter draw depends on
(dataset, hparams_seed, name), so the trials of a draw share its values and two
algorithms share the values of the names they have in common; MNIST environments are
built once from a fixed dataset seed; validation splits are evaluated with the plain
evaluation transform. Its trials therefore share draws and environments, and its error
bars measure what changes between trials: splits, weights and minibatches.

`domainbed` is DomainBed's experiment (its sweep and train scripts at HEAD b93c22a):

- hyperparameters: each name draws from its own `numpy.random.RandomState` seeded by
  DomainBed's hash of (DomainBed's hash of (hparams_seed, trial_seed), name), so every
  trial is a new draw; hparams_seed 0 gives DomainBed's defaults. The distributions are
  the algorithms' and datasets' own declarations (which use DomainBed's names and
  distributions); the table below holds only what a declaration cannot say: which names
  DomainBed draws for an algorithm, its defaults where ours differ, and its names that
  some of our spaces lack (a digit dataset declares no backbone names);
- the run's seed is DomainBed's: its hash of (dataset, algorithm, test_envs,
  hparams_seed, trial_seed), with DomainBed's dataset name;
- datasets are built as DomainBed builds them from that seed (`DOMAINBED_SEED` on the
  dataset class): MNIST environments are reshuffled, coloured and rotated per run; image
  datasets evaluate the splits of training environments through the training augmentation;
- the network's initial weights are DomainBed's: torch's global generator is where DomainBed's
  `train.py` leaves it when it builds the network (`seed_as_domainbed`), after the dataset's
  draws and its DataLoaders', so a run seed gives DomainBed's weights bit for bit;
- the in/out splits are DomainBed's (`misc.split_dataset`, seeded by its hash of (trial_seed,
  environment)): the same examples in the same order, so a run trains, validates and tests on
  DomainBed's examples (`domaingen.datasets.splits`);
- the minibatches are drawn as DomainBed's loaders draw them, uniformly with replacement from each
  training split, but from domaingen's own generators: DomainBed's sequence also depends on when its
  loader workers prefetch and its evaluation loaders reseed torch's global generator, which is not
  reproduced. Image models also run channels-last where DomainBed's are contiguous, which changes
  results only by rounding (results/irm_rmnist_cnn_domainbed.md measures both: fed DomainBed's
  minibatches and kept contiguous, a run records DomainBed's accuracies digit for digit);
- everything else (selection, error bars, checkpoints, resume) as in `paired`.

The domainbed protocol is defined only for the algorithms and datasets DomainBed has;
any other is refused before a run writes anything (run it under `paired`).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch

from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, HParamError, domainbed_seed_hash

PAIRED = "paired"
DOMAINBED = "domainbed"
PROTOCOLS = (PAIRED, DOMAINBED)
# the protocol of a run or sweep recorded without one (written before protocols were recorded)
RECORDED_DEFAULT = PAIRED

# What a table's footnote says about the protocol its runs followed.
PROTOCOL_NOTES = {
    PAIRED: "protocol paired: the trials of a draw share its hyperparameters and the environments "
            "(built once); trials differ in their splits, weights and minibatches",
    DOMAINBED: "protocol domainbed: every trial draws its own hyperparameters and rebuilds the environments "
               "from its seed, as DomainBed's sweep does",
}

# --- DomainBed's facts (HEAD b93c22a), as data --------------------------------------------------

# domainbed/algorithms.py ALGORITHMS
DOMAINBED_ALGORITHMS = (
    "ERM", "ERMPlusPlus", "Fish", "IRM", "GroupDRO", "Mixup", "MLDG", "CORAL", "MMD", "DANN", "CDANN", "MTL",
    "SagNet", "ARM", "VREx", "RSC", "SD", "ANDMask", "SANDMask", "IGA", "SelfReg", "Fishr", "TRM", "IB_ERM",
    "IB_IRM", "CAD", "CondCAD", "Transfer", "CausIRL_CORAL", "CausIRL_MMD", "EQRM", "RDM", "ADRMX", "URM",
)

# our dataset name -> DomainBed's (domainbed/datasets.py DATASETS); it enters the run's seed
DOMAINBED_DATASETS = {
    "ColoredMNIST": "ColoredMNIST", "RotatedMNIST": "RotatedMNIST", "VLCS": "VLCS", "PACS": "PACS",
    "OfficeHome": "OfficeHome", "TerraIncognita": "TerraIncognita", "DomainNet": "DomainNet",
    "Camelyon17": "WILDSCamelyon", "FMoW": "WILDSFMoW", "SVIRO": "SVIRO",
    **{name: name for name in ("SpawriousO2O_easy", "SpawriousO2O_medium", "SpawriousO2O_hard",
                               "SpawriousM2M_easy", "SpawriousM2M_medium", "SpawriousM2M_hard")},
}

# Names DomainBed's registry draws for every algorithm (where our space has them).
EVERY_ALGORITHM = ("lr", "weight_decay", "batch_size", "resnet_dropout", "vit_dropout", "nonlinear_classifier")

# Names DomainBed draws in an algorithm's own block that our datasets declare for every
# algorithm (an algorithm's own HPARAMS are drawn anyway).
ALGORITHM_EXTRAS: dict[str, tuple[str, ...]] = {
    "DANN": ("mlp_width", "mlp_depth", "mlp_dropout"),
    "CDANN": ("mlp_width", "mlp_depth", "mlp_dropout"),
    "ADRMX": ("mlp_width", "mlp_depth", "mlp_dropout"),
}

# DomainBed's default where our declaration's differs: (algorithm, name) -> value.
DEFAULTS: dict[tuple[str, str], Any] = {
    # ours is 0.5: |mean sign| never exceeds 1, so at tau = 1 every mask element is 0 and nothing trains
    ("SANDMask", "tau"): 1.0,
}

# Names both have whose value we keep under this protocol too, and why.
KEPT: dict[str, str] = {
    "freeze_bn": "DomainBed HEAD defaults to False (BatchNorm statistics update); the published tables "
                 "(2021 code) froze them, as our default does",
}

# DomainBed's names that are not in every run's space here (the backbone names are declared by the
# image datasets only: a digit dataset builds no backbone), and why none is needed where absent.
DOMAINBED_ONLY: dict[str, str] = {
    "data_augmentation": "True: image datasets always train through the augmentation",
    "resnet18": "False: our `backbone` is resnet50 unless set; image datasets declare the flag",
    "resnet50_augmix": "True at HEAD (AugMix ResNet-50 weights); the published tables used ImageNet weights, as our "
                       "default does; image datasets declare the flag",
    "dinov2": "False; image datasets declare it (with vit: the DINOv2 ViT-B/14 backbone)",
    "vit": "False; image datasets declare it (with dinov2: the DINOv2 ViT-B/14 backbone)",
    "vit_attn_tune": "False; image datasets declare it (a ViT backbone trains its attention only)",
    "vit_dropout": "drawn, used only by a ViT backbone; image datasets declare it",
    "lars": "False: used only by ERMPlusPlus, which declares it",
    "linear_steps": "500: used only by ERMPlusPlus, which declares it",
    "class_balanced": "False: no class-balanced sampling",
    "nonlinear_classifier": "False: its random choice is [False, False]",
    "resnet_dropout": "drawn, used only by a convolutional backbone; image datasets declare it",
}


class ProtocolError(DomaingenError):
    """A protocol that cannot be used for this run."""


def check_protocol(name: str) -> str:
    """`name` if it is a protocol, else a one-line error listing them."""
    if name not in PROTOCOLS:
        raise ProtocolError(f"unknown protocol {name!r}; choose one of: {', '.join(PROTOCOLS)}")
    return name


def check_domainbed_problem(algorithm: str, dataset: str) -> None:
    """Refuse an algorithm or dataset DomainBed does not have (its experiment is undefined there)."""
    if algorithm not in DOMAINBED_ALGORITHMS:
        raise ProtocolError(
            f"--protocol domainbed: DomainBed has no algorithm {algorithm!r}; run it with --protocol paired")
    if dataset not in DOMAINBED_DATASETS:
        raise ProtocolError(
            f"--protocol domainbed: DomainBed has no dataset {dataset!r}; run it with --protocol paired")


def covered_by_domainbed(algorithm: str, dataset: str) -> bool:
    """Whether DomainBed has both the algorithm and the dataset (its experiment is defined there)."""
    return algorithm in DOMAINBED_ALGORITHMS and dataset in DOMAINBED_DATASETS


def default_protocol(problems: Iterable[tuple[str, str]]) -> str:
    """The protocol when none is asked for: DomainBed's experiment where DomainBed has every
    (algorithm, dataset) of the run or sweep, else paired (one protocol per sweep directory)."""
    problems = list(problems)
    return DOMAINBED if problems and all(covered_by_domainbed(a, d) for a, d in problems) else PAIRED


def domainbed_run_seed(dataset: str, algorithm: str, test_envs: Sequence[int], hparams_seed: int,
                       trial_seed: int) -> int:
    """The `seed` DomainBed's sweep gives the run (weights, minibatches and, for MNIST, the environments)."""
    return domainbed_seed_hash(DOMAINBED_DATASETS[dataset], algorithm, [int(e) for e in test_envs],
                               int(hparams_seed), int(trial_seed))


def domainbed_drawn_names(algorithm: str, algorithm_space: Mapping[str, HParam]) -> set[str]:
    """The names DomainBed draws for `algorithm`: every algorithm's, its own declarations', its extras."""
    return {*EVERY_ALGORITHM, *algorithm_space, *ALGORITHM_EXTRAS.get(algorithm, ())} - set(KEPT)


def draw_domainbed_hparams(space: Mapping[str, HParam], algorithm: str, algorithm_space: Mapping[str, HParam],
                           hparams_seed: int, trial_seed: int) -> dict[str, Any]:
    """One run's hyperparameters as DomainBed's registry draws them (`space` resolved for the dataset).

    hparams_seed 0: DomainBed's defaults. Otherwise every name DomainBed draws for the
    algorithm comes from its own RandomState; the others keep their default.
    """
    if hparams_seed < 0:
        raise HParamError(f"hparams_seed must be >= 0, got {hparams_seed}")
    drawn = domainbed_drawn_names(algorithm, algorithm_space)
    run_seed = domainbed_seed_hash(int(hparams_seed), int(trial_seed))
    values: dict[str, Any] = {}
    for name, hp in space.items():
        if hparams_seed > 0 and hp.sampler is not None and name in drawn:
            values[name] = hp.sampler(np.random.RandomState(domainbed_seed_hash(run_seed, name)))
        else:
            values[name] = DEFAULTS.get((algorithm, name), hp.default)
    return values


# DomainBed's train.py builds, before the network, a DataLoader for each training environment's in
# split and one for each split it evaluates (in and out of every environment), all with worker
# processes. Each draws two int64s from torch's global generator as it is built: its iterator's base
# seed, and its RandomSampler's seed when the iterator prefetches.
DOMAINBED_DRAWS_PER_LOADER = 2


def seed_as_domainbed(seed: int, dataset: Any, n_envs: int, n_test_envs: int) -> None:
    """Put torch's global generator where DomainBed's train.py has it when it builds the network.

    DomainBed seeds the generator once with the run's seed, builds the dataset from it (MNIST
    datasets shuffle and colour from it: `dataset.domainbed_rng_state` is the state that leaves),
    then its loaders draw (`DOMAINBED_DRAWS_PER_LOADER` each), and only then are the weights drawn.
    Seeding just before the network instead would draw the weights from the very numbers that
    shuffled the environments. Class-balanced sampling (DomainBed's `class_balanced`) draws
    otherwise; domaingen has no such option.
    """
    state = getattr(dataset, "domainbed_rng_state", None)
    if state is not None:
        torch.set_rng_state(state)
    else:
        torch.manual_seed(seed)
    loaders = (n_envs - n_test_envs) + 2 * n_envs
    for _ in range(DOMAINBED_DRAWS_PER_LOADER * loaders):
        torch.empty((), dtype=torch.int64).random_()
