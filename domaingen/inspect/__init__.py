r"""Looking inside runs: `domaingen evaluate` and `diagnose` (diagnose.py, with neurons.py and
domain_masks.py: pure functions, tested by hand), the HTML report of a sweep (report.py), and a
sweep's runs combined per trial, `domaingen average` (combine.py, with the combiners' table in
combiners.py), and Csordás et al.'s permuted-MNIST transfer experiment, `domaingen mask-transfer`
(mask_transfer.py).

Reference (`python -m pydoc domaingen.inspect` prints it):

### `domaingen evaluate`: reload the selected model

```
domaingen evaluate RUN_DIR [--checkpoint selected|last] [--data_dir DIR] [--device cpu] [--precision fp32|bf16]
```
rebuilds the run's dataset and splits from its `args.json`, loads the weights
of `selected.pt` (default) or of `checkpoint.pt` (`--checkpoint last`), and
prints every environment's in/out accuracy, plus the algorithm's test-time
modes (`Algorithm.EVAL_MODES`: DMG's `mask_ens` and known-domain `kd`, which is
undefined, `-`, on a held-out environment). The last line compares them with the
record written at that step (`equal to the record of step 50 (18 accuracies)`).
`--precision` evaluates the same weights in another precision than the run's own (what
its `auto` resolved to where it started), and that last line then says how far the
accuracies move. `--data_dir` defaults to the directory the run was trained from. A run without
`selected.pt` gets one line that says so and offers
`--checkpoint last`; missing data gives the same one-line error as `train`.
Neither writes anything into the run directory, except `--masks_x_domains`:

`domaingen evaluate RUN_DIR --masks_x_domains`, for an algorithm whose prediction takes a
domain (DMG's masks, MultiHead's heads; any other is refused in one line), applies each
training domain's mask (or head) to every environment, held-out ones included, and adds
the Pred-Ens and (DMG) Mask-Ens rows: DMG's Table 4. A held-out column reads its `in`
split, a training column its in-domain test split where the run has one
(`--in_domain_test`), else its `out` split (which selection has seen); the header says
which. The matrix goes into `RUN_DIR/diagnostics.json` under `masks_x_domains` (`diagnose`
keeps it) and `report` draws it as a heatmap (masks_x_domains.py). Over a sweep,
`domaingen collect masks-x-domains --input_dir DIR [--format csv]` averages the matrices
of the runs training-domain validation selects, cell by cell over trials, with the tables'
error bar, and names each selected run it left out (no matrix, or one of another step)
(masks_over_trials.py); `report` draws those means as heatmaps too.

### `domaingen diagnose`: what the network does inside

```
domaingen diagnose RUN_DIR [--checkpoint selected|last] [--max_examples 2000]
                           [--domain_masks [--mask_steps 300] [--mask_alpha 1e-5] [--mask_seed S [S ...]]]
                           [--output FILE]
```
writes `RUN_DIR/diagnostics.json` (or `--output`) and prints a summary, for
any algorithm. The examples of an environment are data the model never trained
on: a training environment's `out` split, the held-out environment's `in`
split (where test accuracy is measured), at most `--max_examples` of each.

- **Neuron selectivity**, per layer and environment, as the feature-contamination
  paper defines it (Zhang et al., ICML 2024, after Morcos et al. 2018): with
  mu_c a neuron's mean post-ReLU activation over the examples of class c,
  selectivity = (mu_max - mean of the other classes' mu) / (mu_max + that mean + 1e-8);
  0 for a silent neuron, 1 for a neuron that fires for one class only. A
  convolution's neuron is a channel, its activation the mean over positions.
  The layers are the featurizer's ReLUs (a ResNet's `layer1`..`layer4`
  outputs). Per layer: every neuron's value and the mean and quartiles, per
  environment and pooled over the training environments (`train`) and the
  held-out ones (`test`).
- **Class-conditional activation rates**: per layer and class, the fraction of
  examples on which a neuron's activation is > 0 (mean over neurons), and the
  fraction of dead neurons. A convolution channel counts per position: the
  fraction of (example, position) pairs where it is > 0 ("some position fired"
  saturates at 1 on ResNets).
- **Feature contamination** (runs on `FeatureContamination*`, section
  `feature_contamination`, inspect/contamination.py): per first-layer neuron the
  norm of its weights' projection onto the core and the background subspaces,
  and its class-activation asymmetry (the share of its positive pre-activation
  from its dominant class: 0.5 both classes alike, 1 one class only), with means.
- **Algorithm sections**, from the algorithm class's `model_diagnostics()` hook:
  DMG's `dmg_masks` (per masked layer the domain x neuron probabilities, the
  discrete masks and their pairwise IoU), X+ModReg's `modreg_masks` (per layer
  kept weights, input features kept, the distribution of sigmoid(logit) with a
  20-bin histogram). Neurons are recorded during `activation_forward` (DMG:
  one Mask-Ens pass), from the modules `activation_layers()` names; both hooks
  have defaults in `Algorithm`, so a new algorithm is diagnosed with no edit
  elsewhere, and adds a section by overriding `model_diagnostics()`.
- **Weight sharing across domains** (`--domain_masks`): Csordás et al.'s weight
  masks (ICLR 2021) applied to domains. The weights are frozen; for each
  training domain a mask over every Linear and Conv2d weight (the Gumbel-sigmoid
  straight-through masks of `domaingen.masks`, logits starting at 2.0) is trained
  on that domain's `in` split alone, with cross-entropy plus alpha * sum of the
  logits, Adam at lr 1e-2, batch 64, `--mask_steps` steps (300). Reported per
  layer: each domain's kept fraction, the fraction of kept weights that every
  domain keeps, the pairwise IoU; and per domain the accuracy on its `out` split
  with its mask beside the unmasked network's. alpha = 1e-5 is our choice, not a
  published value: on an ERM MLP of `sweeps/inside.toml` alpha = 1e-6 kept every
  weight after 150 steps and 1e-4 removed nearly all of them after 300; treat
  the masks of a bounded run as a coarse view. Csordás et al.'s tests besides:
  `accuracy_matrix` (each domain's mask on every environment's diagnostic
  examples, the held-out one included), `inverted_accuracy_matrix` (the same
  masks inverted: only the weights they removed), `unmasked_accuracy`, a
  `control` mask trained on every training domain together at the same alpha
  (`--mask_alpha`; the paper calibrates the strength so that such a control keeps
  the unmasked accuracy: a control that loses accuracy means alpha is too
  strong), the asymmetric sharing s(t, r) = |M_t & M_r| / |M_t| (overall and per
  layer), each mask's kept weights (overall and per layer) and the weight ratio
  kept(t) / kept(r), and a 20-bin histogram of each mask's keep probabilities.
  `--mask_seed S` seeds the masks' training (Gumbel noise and batches; without it
  they draw from the run's seed); two or more seeds train every domain's mask once
  per seed and add `seed_stability`: per domain the IoU over all masked weights of
  every pair of seeds, their mean and std, and per layer the mean IoU. A run with
  one training domain, a non-positive `--mask_alpha`, or repeated or negative mask
  seeds is refused in one line.

### Csordás et al.'s experiments (ICLR 2021) with these masks

Their arithmetic tasks are datasets (datasets/arithmetic.py): `AddMul` (environments
`add`, `mul`, and `add+mul` mixed, held out for the test set: 42 inputs, 20 digit
logits) and `DoubleAddition` (`pair1`, `pair2`, mixed: 80 inputs, 40 digit logits),
trained with the paper's small feedforward network (`DigitMLP`, hidden 400, 400, 200):

```
domaingen train --dataset AddMul --algorithm ERM --test_envs 2 --output_dir out/addmul
domaingen diagnose out/addmul --domain_masks --mask_steps 6000 --mask_alpha 1e-5 --mask_seed 0 1 2
domaingen train --dataset DoubleAddition --algorithm ERM --test_envs 2 --output_dir out/double
domaingen diagnose out/double --domain_masks --mask_steps 6000 --mask_alpha 1e-5 --mask_seed 0
domaingen collect domain-masks --input_dir out/addmul
```

`sweeps/csordas.toml` trains both tasks over trials (its header gives the diagnose loop), and
`collect domain-masks --input_dir DIR` tabulates every run's masks, per trial and mean ± error,
with the paper's numbers beside them (tables/domain_mask_tables.py).

- add/mul: the per-layer table gives each mask's kept weights and s(add, mul),
  s(mul, add) (the paper's "shared weights" per layer: more in the input and output
  layers than the hidden ones), and `weight ratio mul/add` the paper's 3.8x;
- double addition: the mask table's inverted masks (in brackets) test reuse
  (P_reuse): the paper finds that pair 2 still works with pair 1's mask inverted,
  so the pairs do not share an addition module;
- `--mask_seed 0 1 2` gives the masks' IoU between seeds (the paper: 93.26 +- 0.96 %,
  on CIFAR-10).

alpha: the paper's 1e-4 weighs the mean per-digit cross-entropy; our loss is the sum
over the two digits, so 2e-4 would keep its balance, but with our masks (one sample per
step, batch 64, 2,000-6,000 steps against the paper's 20,000) it removes nearly every
weight (masked accuracy under 10 %); 1e-5 is the strength at which the control keeps
addition (98 %), though multiplication's own mask keeps only 63 % of its 99 % (measured
2026-11-27 on one run of each task; add/mul above: 6 min of one CPU thread).

Cost: `make bench` (`--only diagnose`) times `diagnose` without
`--domain_masks` of an MNIST_CNN ERM model on ColoredMNIST (3 x 2000 examples,
448 neurons): 45 s wall and 13 s CPU, reload and ColoredMNIST build included,
measured on the AMD EPYC (Zen 5, 2 vCPUs) shared with about seven other jobs
(load average 15-28), 2026-11-23. With `--domain_masks` an MLP of
`sweeps/inside.toml` took 520 s wall (143 s CPU) for 2 x 300 steps under the same load.

### `domaingen report`: one page per sweep

```
pip install -e '.[plots]'        # matplotlib
domaingen report SWEEP_DIR --output DIR [--selection training]
```
writes `DIR/index.html`, a static page that embeds its figures (also written
as PNG files beside it) and the data they plot (a JSON block,
`id="figure-data"`): `collect`'s tables (selection rule and data source in the
caption); a bar chart of test accuracy per algorithm and test environment,
± the tables' error bar (DomainBed's, std(x / sqrt(n)) with ddof 0, defined on
the page with the trial count); marked cells (step 0 selected, every candidate tied)
carry the tables' footnotes; and for the selected run of each cell (the first
trial of the hyperparameters that `--selection` picks) its accuracy of every
environment's in and out split over steps with the selected checkpoint marked,
its losses over steps (record fields named `loss`, `*nll`, `*penalty`, `*_s1`...),
its mask curves over steps (fields ending in `iou` or `kept_fraction`: DMG's
IoU, ModReg's kept fraction), DMG-style mask heatmaps (from `diagnostics.json`,
else from `selected.pt`'s `masks.logits.*`), and selectivity histograms
(training vs held-out) where `diagnose` has been run; for `diagnose
--domain_masks`, the mask-by-environment accuracy heatmaps (masks kept and
inverted, control, unmasked), the sharing s(t, r) and the keep-probability
histograms; for `evaluate --masks_x_domains`, its matrix (accuracy heatmaps
on a fixed 0-100 % scale); for
FeatureContamination runs, the first-layer projections onto the core and
background subspaces and the probe accuracy per background shift over steps,
and each neuron's projections coloured by its asymmetry. Checkpoints that skip a
split leave gaps in its curve. A still-running sweep gives a page of the runs
that are done; a sweep with no finished run gives a page that says so.

Cost: `make bench` (`--only report`) writes a synthetic sweep directory of
10,000 done runs (110,000 records: 8 algorithms, ColoredMNIST and RotatedMNIST,
every test environment) and reports it: 72 selected runs, 173 figures, rendered
in up to 4 worker processes: 13.1 s wall, 19.8 s CPU in all, on 2 idle vCPUs of an
AMD EPYC Zen 4 (2026-11-23, steal 0%; target 30 s). The tables index the records
and the sweep's run grid once rather than masking the frames per cell (under load the
table step takes 11.2 s this way, 18.8 s masking per cell). `diagnose` of an MNIST_CNN run
(`--only diagnose`, no domain masks, 3 environments x 2000 examples, 448 neurons):
6.2 s wall on the same idle machine (target 1 minute).

### `domaingen average`: DiWA, soups and ENS from a sweep's runs

```
domaingen sweep launch ... --shared_init linear_probe   # every draw of a trial fine-tunes its linear probe
domaingen average --input_dir SWEEP_DIR [--combiners DiWA-uniform DiWA-greedy soup ENS]
domaingen collect --input_dir SWEEP_DIR                 # rows X (DiWA-greedy), X (DiWA-uniform), X (soup), X (ENS)
```
combines, per (dataset, algorithm, test environments, trial), the sweep's done runs and writes
each combination to `SWEEP_DIR/combined/` as a run with one record (see combine.py and
combiners.py). Weight averages are refused in one line, with nothing written, for runs without
one shared initialisation (`shared_init_id` in their records) or of different architectures,
and DiWA-greedy for runs without validation records.
"""
