"""domaingen: a domain-generalization benchmark suite.

Train a table of algorithms on a table of multi-domain datasets, hold one domain
out, sweep random hyperparameters, select models without peeking at the
held-out domain, and report leave-one-domain-out accuracy tables.

What changed in 0.3. Sweep directories and runs written by 0.2 collect to the same tables,
relaunch without running anything, and resume to the records an uninterrupted run writes
(`tests/fixtures/release_0_2_0` holds such a sweep and an interrupted run; `tests/test_settings.py`
checks all three). The default protocol is DomainBed's experiment wherever DomainBed has the
algorithm and the dataset (else `paired`, 0.2's default for everything); a run or sweep keeps
the protocol it recorded. `collect`'s alternative outputs are commands of their own: `--top_hparams`,
`--trajectories GLOB`, `--draws`, `--versus DIR`, `--masks_x_domains` and `--manifest` became
`collect top-hparams`, `collect trajectories --fields GLOB`, `collect draws`,
`collect versus --other DIR`, `collect masks-x-domains` and `collect manifest`; the old
flags stop in one line naming their command. Selection methods and launchers are registries
(`domaingen.tables.selection.register_selection_method`,
`domaingen.sweep.launch.register_launcher`); `METHODS`, `METHOD_TITLES` and
`tables.reference.SELECTIONS` are gone. `MinibatchSampler` is imported from
`domaingen.datasets.sampling` only. `domaingen.cli.main.main` returns 2 for a command line
argparse refuses, instead of raising SystemExit. New: `collect ranks`, `collect intervals`,
`collect --baseline`, paired tests in the `--paired` tables, `domaingen spec`, DomainBed's flags,
`--time_budget`, `sweep restore` (a sweep directory back from its exported bundle). Launching some
of a recorded sweep's jobs into its directory (`--parts`, fewer trials) keeps its record; 0.2
refused it as a different spec.

What moved in 0.2. The public paths stay: `domaingen.algorithms.base`,
`domaingen.datasets`, `domaingen.networks` (its device helpers now live in
`domaingen.devices` and are still importable from it), `domaingen.hparams`,
`domaingen.testing`, `domaingen.plugins`. The rest moved into parts:
`training`, `evaluation`, `eval_plan`, `rundir`, `runlock`, `reload`, `precision` ->
`domaingen.run.*`; `sweep` -> `domaingen.sweep.spec`; `launchers` -> `domaingen.sweep.launch`
(and `workers`, `local`, `parallel`, `slurm`); `ray_launcher`, `slurm_jobs`, `gpus` ->
`domaingen.sweep.*`; `collect`, `selection`, `reporting`, `comparisons`, `top_hparams`,
`wilds_selection`, `reference` -> `domaingen.tables.*`, `sweep_views` ->
`domaingen.tables.views`; `diagnose`, `report`, `analysis.*` -> `domaingen.inspect.*`;
`bench` -> `domaingen.bench.benchmarks` (`python -m domaingen.bench` as before),
`bench_baseline` -> `domaingen.bench.baseline`; `download` -> `domaingen.datasets.download`;
`cli`, `sweep_cli`, `inspect_cli` -> `domaingen.cli.{main,sweep_commands,inspect_commands}`
(`domaingen.cli.main` is still `domaingen.cli:main`). The distribution is now
`domaingen-bench`.
"""

__version__ = "0.3.0"
