r"""The algorithm table. Importing this package imports every module in it, and so
registers every built-in algorithm: a new algorithm is one new module here.

Reference for ModReg and DMG (`python -m pydoc domaingen.algorithms` prints it):

### ModReg: `X+ModReg` for any algorithm X

ModReg (Ashok et al., AAAI-22 student abstract) gives every Linear and Conv2d
weight of the featurizer and classifier a mask logit l (`domaingen/masks/weight_masks.py`).
Training uses a hard Gumbel-sigmoid sample b = 1[sigmoid((l - log(log U1 / log
U2)) / tau) > 0.5] with tau = 1 and the straight-through gradient, so E[b] =
sigmoid(l); logits start at `modreg_init_logit` = 2 (kept with probability
0.88). The batch is cut into `modreg_groups` = 4 interleaved groups (example n in
group n mod 4), each with its own mask sample: a Linear layer runs one matrix
product per group over a strided view of that group's rows (no copy of the batch), a
Conv2d one grouped convolution. In eval mode the mask is 1[sigmoid(l) > 0.5]. Biases are
unmasked unless `modreg_mask_bias`. With pi = sigmoid(l), per layer and input
feature p over the weights leaving p (W[:, p], or W[:, p, :, :] for a conv):

    loss = loss of X + modreg_scale * (modreg_alpha * S1 + modreg_beta * S2)
    S1 = sum_p (sum pi)^2        S2 = sum_p sqrt(sum pi^2)

(`modreg_scale` 1 by default; alpha and beta below include it). The abstract writes both
"pi in [0, 1]" and "sigmoid(pi) > 0.5": `modreg_pi` = sigmoid (the default) reads pi as the
keep probability sigmoid(l), `modreg_pi` = logit as the mask logit l itself (S2 then pulls
each logit toward 0, a keep probability of 0.5, rather than toward pruning).

The penalty is part of X's objective, for every X. Every algorithm adds
`self.regularization(module)` to each loss it backpropagates (for plain X the L2 term
of the IRM paper's protocol, 0 elsewhere), and `X+ModReg` adds alpha * S1 + beta * S2 of
that module's mask logits there, with a closed-form gradient. Per algorithm:

| X | what X+ModReg optimises |
|---|---|
| ERM | CE + L2 + alpha S1 + beta S2 |
| IRM, VREx (`penalty_schedule` domainbed) | mean risk + w * penalty + L2 + alpha S1 + beta S2; Adam re-created at the switch, masks again in their own group |
| IRM, VREx (`penalty_schedule` irm_paper) | (mean risk + w * penalty + L2 + alpha S1 + beta S2) / w once w > 1: the ModReg penalty is divided with the rest; with `modreg_rescaled` false, (mean risk + w * penalty + L2) / w + alpha S1 + beta S2 |
| Fish | each inner step: CE of one environment + L2 + alpha S1 + beta S2 of the inner clone's logits; the meta step moves the logits like every other parameter |
| SANDMask | every environment's gradient is that of CE_e + L2 + alpha S1 + beta S2, so the sign-agreement mask is computed on the combined gradients |
| DMG | CE under the domain's neuron masks + lambda_O * overlap + L2 + alpha S1 + beta S2 |

Each row is tested against autograd of that objective written out independently
(`tests/test_modreg.py`). An algorithm that sets `NO_ADDITIVE_PENALTY` (a reason; none of
the built-in ones does) is refused by `X+ModReg` with that reason, and one whose update
never calls `self.regularization` fails at its first ModReg update instead of silently
training without the penalty.

The mask logits form a parameter group of their own in each of X's
optimizers (built by `make_adam(module, hparams)`, which every algorithm uses), with
learning rate `modreg_mask_lr` and no weight decay (they are not weights), searched
over 10^U(-3,-1). Adam makes a logit's step about `modreg_mask_lr` whatever its gradient's
size, so a logit that only the penalty moves (an input that is always 0, a weight the loss
does not need) falls by about mask lr per step for as long as training lasts: from its start
at 2 it cannot cross 0 before 2 / mask lr steps (2000 at 1e-3; in the IRM paper's 501
steps, none), and the kept fraction is set more by mask lr x steps than by the task.
**Where the defaults come from:** `modreg_alpha` 6.93e-10, `modreg_beta`
1.12e-5 and `modreg_mask_lr` 1e-3 (the weights' rate): a tenth of the penalty first chosen
by `sweeps/modreg_defaults.toml`, with the mask lr divided by 10. The first choice (6.93e-9,
1.12e-4, 1.05e-2) was ColoredMNIST's hparams_seed 13; that seed draws other values on
RotatedMNIST (alpha 2.04e-8, beta 2.09e-5, mask lr 1.43e-3: each dataset draws its own),
and `collect draws` shows the first dataset's draw on every row, so its RotatedMNIST run
(59% of the weights kept) was not the defaults. At the first defaults RotatedMNIST (MLP,
2000 steps) keeps 4.1% on every seed, still falling (34% at step 500, 1.5% at 5000), about
6 test points below ERM; at the current ones it keeps 86-88% at step 2000 on five seeds (the
weights of the always-black pixels and 14% of the first layer's others pruned) at ERM's
accuracy, and on the IRM paper's protocol it prunes nothing (results/README.md).
`modreg_init_logit` stays 2 (keep probability 0.88), domaingen's own choice, kept so that
earlier ModReg results stay comparable: Csordás et al. (ICLR 2021) initialise the masks to a keep
probability of 0.9, a logit of ln 9 = 2.197 (set `modreg_init_logit` to 2.197 for theirs). Each
record carries `modreg_penalty`, `modreg_s1`, `modreg_s2` and, per masked layer,
`modreg_<layer>_kept_fraction`, `modreg_<layer>_inputs_kept` (input features that
keep any outgoing weight), `modreg_<layer>_inputs_total`, and the keep probabilities
sigmoid(l) of the layer's weights: `modreg_<layer>_keep_prob_mean` and the 10th, 50th and
90th percentiles `modreg_<layer>_keep_prob_p10` / `_p50` / `_p90` (they show logits
moving toward 0 before the deterministic mask drops any weight), plus the overall
`modreg_kept_fraction`. A negative alpha or beta, a `modreg_scale` or `modreg_mask_lr` that is not
positive, an unknown `modreg_pi`, or a network without a Linear or Conv2d layer, is an error. Composition is a registry feature:
`ALGORITHMS.register_modifier("ModReg", with_modreg)`.

### DMG

One logit per neuron (per channel for convolutions) per training domain,
initialised U(0,1), on the inputs of the late layers (`dmg_layers`, default
`auto`: MNIST_CNN, its last two convolutions and the classifier; MLP, its
Linear layers after the first and the classifier, i.e. the hidden activations;
ResNet, `resnet.layer3`, `resnet.layer4` and the classifier; or comma-separated
module names such as `featurizer.layers.9,classifier`). Training samples each
example's mask from Bernoulli(sigmoid(logit)) of its own domain (minibatch d is
domain d), with the straight-through gradient; loss = cross-entropy +
`dmg_lambda_o` x (the soft IoU of the domains' mask probabilities, summed over
masked layers and domain pairs: the paper's sum over L and (d_i, d_j)).
`dmg_overlap_reduction` "mean" averages over the domain pairs within a layer
instead, as the authors' public code does (prithv1/DMG, models/supermasks.py,
`overlap_penalty`); with D training domains the sum is D(D-1)/2 times the mean.
`dmg_lambda_s` (default 0, off) adds lambda_S x the L1 norm of the masks (every
domain's keep probabilities sigmoid(logit) summed over neurons and masked layers),
the sparsity incentive of the authors' code (OPTIM.SPARSITY_LAMBDA,
`sparsity_penalty`; 0 in their PACS and DomainNet configs); `update` then also
reports `sparsity`, the unweighted norm. `sweeps/dmg_sparsity_rmnist.toml` varies it.
Hyperparameters: `dmg_lambda_o` 0.1 (search: 0 with probability 0.2, else
10^U(-5,0)); `dmg_mask_lr` 1e-3, the Adam learning rate of the mask logits
(search 10^U(-4,-2); the paper used 1e-4 for net and masks, our MNIST net lr is
1e-3, and at 1e-4 the masks hardly move in a few hundred steps).

Test-time modes: `predict(x)` is Pred-Ens (the logits averaged over the source
domains' soft masks, one pass with the batch tiled over the domains from the
first masked layer on); `predict(x, mode="mask_ens")` uses the mean soft mask;
`predict(x, domain=d)` (an index or one per example) is known-domain (KD). A
domain index out of range, or KD without `domain`, is an error that says so.
Records hold, besides `env{i}_{in,out}_acc` (Pred-Ens, what selection uses),
`env{i}_{in,out}_acc_mask_ens` for every environment and `env{i}_{in,out}_acc_kd`
for the training environments only (KD is undefined on a held-out domain), and,
per masked layer k (in `dmg_layers` order), the statistics of the discrete masks
sigmoid(logit) > 0.5: `dmg_layer{k}_iou` (mean pairwise IoU over domains, pairs of
two empty masks left out), `dmg_layer{k}_active` (fraction kept),
`dmg_layer{k}_shared` / `_specific` / `_unused` (neurons kept by every domain / by
some but not all / by none), and `dmg_iou`, the mean over layers. `collect`
turns each mode into a row of its own: `DMG-MaskEns`, and `DMG-KD`, which appears
in the in-domain tables only (under oracle and leave-one-domain-out selection it
is marked undefined, since they validate on held-out domains). A negative
`dmg_lambda_o`, `dmg_lambda_s` or `dmg_mask_lr`, an unknown `dmg_overlap_reduction`, and an empty or
repeated `dmg_layers` are refused in one line (and stop a sweep's launch); an unknown
module name in `dmg_layers` is refused in one line once the network is built.

**Which optimisation the defaults follow, and why.** The defaults are DomainBed's
protocol (Adam at the dataset's lr, no weight decay, no schedule, checkpoints chosen by
training-domain validation of the Pred-Ens prediction) with the masks at 1e-3, so that
DMG is compared with every other algorithm under one protocol. The paper's own
optimisation (prithv1/DMG's configs: Adam at 1e-4 for network and masks, weight decay
1e-5 on PACS and 0 on DomainNet, a decaying learning rate) is a preset: the hyperparameter
values of parts 3 and 4 of `sweeps/dmg_pacs.toml` and `sweeps/dmg_domainnet.toml`, which
state that they leave out the decay. `dmg_preset` "paper" sets the PACS values in one
hyperparameter: Adam at 1e-4 for network and masks, weight decay 1e-5 on both, and the
network's learning rate times 0.99 per epoch, as the authors' trainer does (it steps only
the network's scheduler; the masks' learning rate stays constant). An algorithm does not
know the epoch length, so the decay comes every `dmg_decay_every` updates (default 42,
ceil(0.8 x 1670 / 32): PACS's photo domain at batch 32; set it to ceil(smallest training
environment / batch size)). An `lr`, `weight_decay` or `dmg_mask_lr` the user sets wins.
The masked ResNet layers are the code's (models/subnetwork_supermask_model.py: the
inputs of layer3, layer4 and fc).

### MultiHead

The paper's Multi-Headed baseline (multihead.py): one shared featurizer and one
linear head per training domain; training classifies each example with its own domain's
head (cross-entropy over the concatenated minibatches). Known-domain prediction
(`predict(x, domain=d)`, the `kd` mode, row `MultiHead-KD` of the in-domain table) uses
head d; out-of-domain prediction, and `network(x)`, average the heads' logits. With
ModReg (`MultiHead+ModReg`) every head is weight-masked too.
"""

import importlib
import pkgutil

from domaingen.algorithms.base import ALGORITHMS, Algorithm, FeaturizerClassifier

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["ALGORITHMS", "Algorithm", "FeaturizerClassifier"]
