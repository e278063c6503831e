r"""One run: the training loop, what each checkpoint evaluates, the run directory and its lock,
reloading a finished run, and the precision it computes in.

Reference (`python -m pydoc domaingen.run` prints it):

`--compile_eval` evaluates through `torch.compile` (compiled once per run, at the first
checkpoint; batches padded to one shape; if compilation fails, a warning and eager
evaluation; a method that predicts from whole batches evaluates eagerly). On a CPU it
fuses the memory-bound ReLU and GroupNorm layers: a full bf16 evaluation of ColoredMNIST
(70,000 images, MNIST_CNN) takes 12.5 s instead of 16.7 s on the development machine,
which repays the compilation within the first ten of a 5001-step run's 51 checkpoints;
tiny runs are faster without it. Like `--device` it does not change the run's identity,
so a run may be resumed with or without it; compiled bf16 can change a near-tie
prediction now and then. `DOMAINGEN_COMPILE_EVAL=1` turns it on for
every run, sweep jobs included.

`--compile_step off|inductor|cudagraphs` (spec key `compile_step`; default `off`) runs each
training update through `torch.compile` (`inductor`), or also records it as CUDA graphs and
replays them (`cudagraphs`, `mode="reduce-overhead"`, CUDA only: elsewhere one warning and an
eager run). Only algorithms that declare a static-shape update compile it (ERM, CORAL,
GroupDRO, VREx; `Algorithm.EAGER_STEP`); the others train eagerly after one warning saying
why (MMD: its widest kernels amplify rounding), as does a run whose compilation fails.
Compiled updates equal eager ones up to rounding; like `--device` the setting does not change
the run's identity, and each record's `args` states it. On one thread of the development
machine's CPU an ERM step (64 x 2 examples) took 0.93-0.95x the eager CPU time with MNIST_CNN
and 0.95-1.02x with the MLP, after 20-60 s of compiling: CUDA graphs are what it is for. See
`run.compiled_step`; `python -m domaingen.bench --only compile` times it.

A run directory holds `args.json`, `results.jsonl` (one record per checkpoint,
DomainBed's field names: `step`, `epoch`, the losses, `env{i}_in_acc`,
`env{i}_out_acc`, `step_time`, `mem_gb`, `hparams`, `args`, plus `data_source`,
`evaluated`, the splits that checkpoint evaluated (see Evaluated splits), and `eval_time`, the
seconds that evaluation took; the first record each call of `train` writes also holds
`startup_time`, the seconds from the job's start to its first step),
`checkpoint.pt`, `selected.pt` (see the selected checkpoint), `log.txt`, `manifest.json`
(code version, libraries, device, threads, precision: `run.manifest`), with `--logger` also
`tensorboard/` or `wandb/` (`run.loggers`), and last a `done` marker, or a `failed` marker with
the reason (NaN loss, exception). Rerunning the same command resumes an
incomplete run from its last checkpoint with exactly the records an
uninterrupted run would write; a done run is left alone; a directory holding a
run with other arguments is refused. On CUDA a run sets deterministic cuDNN and
`torch.use_deterministic_algorithms(True, warn_only=True)` (`devices.make_deterministic`),
so this holds on a GPU too, except after an operation that has no deterministic CUDA
kernel: torch warns with its name, and such a run may differ from an uninterrupted one
in the last bits. Determinism costs some speed (cuDNN may not pick its fastest
convolution); not yet measured on a GPU.

### The in-domain test split (`--in_domain_test`)

`--in_domain_test f` (spec key `in_domain_test`; default off) splits each training
environment three ways with the seeded permutation of the in/out split
(datasets/splits.py): the validation split (`out`) is exactly the one a run without
it has, the next int(n * f) examples are the in-domain test split, and training reads
the rest. Records hold `env{i}_idtest_acc` (and per test-time mode) for the training
environments (eval_plan's extra splits); no selection method reads them, and the
in-domain table reads only them, at the checkpoint selection chose, so its numbers are
not biased by the selection that saw the `out` splits. Under `--eval_splits final` they
are evaluated where that table reads them: at the last checkpoint, and by the final
evaluation at each checkpoint that a prediction mode selected (`--train_in_every K` adds
them at every K-th checkpoint, for curves); otherwise at every checkpoint. f must lie in (0, 0.5)
and leave every class of a training environment in each of its three splits, else one
line and exit status 2 before anything is written. With DomainNet the split is random
too (its official per-domain test lists are not used).

### Evaluated splits (`--eval_splits`)

`--eval_splits final|selection|all` (spec key `eval_splits`) and `--train_in_every K`
(spec key `train_in_every`). What each selection method reads is listed in
`run.eval_plan`; in short, before the last checkpoint no method reads the training
environments' `in` splits, and only leave-one-domain-out reads a held-out environment
(its `in` split). With **`final` (the default)** every checkpoint evaluates the training
environments' `out` splits (training-domain validation), plus the held-out splits in a
run that holds out two or more environments (leave-one-domain-out's validation; WILDS'
official splits);
the last checkpoint evaluates every split; and a *final evaluation* after it reloads the
weights of the checkpoint that training-domain validation selected (selected.pt, kept
anyway) and evaluates the held-out environment there, for the default prediction and for
each test-time mode that selects its own checkpoint (DMG's mask ensemble), and the
in-domain test splits, for every mode (known-domain prediction included). The final
evaluation is a record of its own (`final.json`: which checkpoint, for which mode, its
validation accuracy, the accuracies) and fills the selected checkpoint's record in
results.jsonl (its `evaluated_at_end` field lists what it added), where `collect` reads
it. Held-out accuracies a checkpoint did not evaluate are present as null, so DomainBed's
own `collect_results.py`, which indexes them in every record, reads these runs too. The
single runs of a sweep that also holds out pairs run with `selection` (their job ids do
not change): leave-one-domain-out may select any of their checkpoints.
`selection` evaluates every `out` split and the held-out `in` splits at every
checkpoint, and the training environments' `in` splits at the last one; `all` every
split at every checkpoint, as DomainBed does. `--train_in_every K` adds the training
environments' `in` (and in-domain test) splits at every K-th checkpoint (counting step 0), for learning
curves. Each record lists the splits it evaluated in `evaluated`.

`collect` gives the same cells from `final`, `selection` and `all` runs of the same seeds
(evaluation draws no random numbers, so training is identical): tested on small sweeps of
singles and pairs, and of ERM and DMG singles, for every selection method, table kind,
`--paired` and `collect versus`, and with a DomainBed-style reader; checked once with DomainBed's
own collect_results, which prints the same tables from a `final` and an `all` sweep.

On ColoredMNIST (test env 2, 20% held out) a `final` checkpoint evaluates 13% of the
examples a full one does (the two training environments' `out` splits), `selection`
47%; a 5001-step run with 51 checkpoints evaluates 16% (`final`, counting the final
evaluation) and 48% (`selection`) of what `all` does.
The choice is part of a run's identity: a resumed run keeps the eval splits it
started with (a run recorded without `eval_splits` resumes with `all`, every split),
and an explicit different `--eval_splits` or `--train_in_every` is refused with one line.
A value other than `final`, `selection` or `all`, or a `--train_in_every` below 1,
stops with one line and exit status 2. In a sweep spec the
keys enter a job's id only when set: a job's id depends on none of them unless its
spec sets it. A single run evaluated with `final` outside a sweep with its pair runs
has no leave-one-domain-out cell (collect says so).

### Precision (auto)

`--precision fp32|bf16|auto` (spec key `precision`). `bf16` runs the forward pass
under bf16 autocast (weights, optimizer state and the loss stay fp32). `auto` picks
bf16 on a CUDA GPU with native bf16 (Ampere and later) and on a CPU with AMX
(`amx_bf16`) or AVX-512 bf16 (`avx512_bf16`) instructions, and fp32 elsewhere (an
AVX2-only CPU emulates bf16 and runs it slower than fp32; a run asked for bf16 there
says so in its log with one warning). A run records what it
asked for (`precision`, part of its identity) and what that meant where it started
(`resolved_precision`, not part of its identity); a resumed run keeps the precision
it started in, whatever the new machine's `auto` would say. A sweep whose jobs run on
machines with different CPUs is therefore one sweep (same job ids), but its runs may
differ in precision: `collect --format csv` and each record's `resolved_precision`
show which; pass `fp32` or `bf16` explicitly when every cell must be computed alike.

**The default stays fp32**, because bf16 is not always as accurate. In the full-length
ERM reproduction (5001 steps, 3 trials, MNIST_CNN, DomainBed's defaults; on an
NVIDIA H100, results/domainbed_erm.*), training-domain validation gave:

| column | bf16 | fp32 | DomainBed (published) |
|---|---|---|---|
| ColoredMNIST -90% | 10.1 ± 0.1 | 10.2 ± 0.0 | 10.0 |
| RotatedMNIST 0° | 95.2 ± 0.1 | 95.6 ± 0.2 | 95.9 |

### The selected checkpoint

Besides `checkpoint.pt` (the last checkpoint, for resuming), a run keeps
`selected.pt`: the weights at the checkpoint that training-domain validation
selects, the best mean `out` accuracy over the training environments so far.
It is rewritten (through a temporary file and a rename) whenever a checkpoint
validates strictly better, so of equally good checkpoints the earliest stays
selected, as in DomainBed's collect. The best so far is also stored in
`checkpoint.pt`, so a resumed run selects exactly what an uninterrupted one
does. A run without validation splits (`--holdout_fraction 0`) has no
`selected.pt`. It holds the model's `state_dict` only (no optimizer state):
1.49 MB for ERM or DMG with MNIST_CNN (measured), 2.98 MB for
ERM+ModReg with MNIST_CNN (its mask logits double the floats), and
23.56 M floats = 94.3 MB for ResNet-50 (torchvision's 23.51 M parameters plus
BatchNorm buffers, fp32; 189 MB with ModReg), per run. `checkpoint.pt`, with
Adam's two moments, is about three times as large.
"""
