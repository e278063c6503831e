"""`domaingen average`: a sweep's runs combined per trial (inspect.combiners), each combination written as a run.

For every (dataset, algorithm X, test environments, trial, protocol) of the sweep's done runs and
every combiner asked for, the combined model is evaluated on every split, as a run's last
checkpoint is, and written to `SWEEP/combined/<hash>/` as a run of its own: args.json (algorithm
`X (LABEL)`, hparams_seed 0, the trial, the runs combined), one record at the runs' last step and
`done`. `collect` reads these as runs (tables.collect.COMBINED_DIR): each trial has one such run,
so every selection rule reads its one record, and every format shows the `X (DiWA-greedy)`,
`X (DiWA-uniform)`, `X (soup)` and `X (ENS)` rows beside X. Running it again rewrites a
combination whose runs changed and leaves the others.

Everything is checked before anything is written: averaging weights needs runs that started from
one initialisation (`shared_init`, whose id every record carries) and share an architecture; a
combiner that orders runs by validation needs their training-domain validation records.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from domaingen.errors import DomaingenError
from domaingen.devices import place_model
from domaingen.run.evaluation import evaluate
from domaingen.run.manifest import MANIFEST, build_manifest, used_libraries
from domaingen.run.reload import LoadedRun, load_run, read_weights, run_precision
from domaingen.run.rundir import ARGS, DONE, DONE_STATE, RESULTS, RunDirectory, atomic_write_bytes, to_json
from domaingen.run.selected import training_validation_accuracy
from domaingen.run.shared_init import INIT_FIELD
from domaingen.tables.collect import COMBINED_DIR, run_protocol
from domaingen.inspect.combiners import COMBINERS, Combiner, Ensemble, average_states

log = logging.getLogger(__name__)


class CombineError(DomaingenError):
    """Runs that cannot be combined as asked."""


@dataclass
class Member:
    """One done run of a trial."""

    path: Path
    args: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return self.path.name

    def validation(self) -> float:
        """Its best training-domain validation accuracy over checkpoints (its selected one's); NaN if none."""
        n_envs = 1 + max((int(k[3:].split("_")[0]) for r in self.records for k in r
                          if k.startswith("env") and k.endswith("_out_acc")), default=-1)
        values = [training_validation_accuracy(r, self.args["test_envs"], n_envs) for r in self.records]
        finite = [v for v in values if math.isfinite(v)]
        return max(finite) if finite else float("nan")


@dataclass
class Combined:
    """One combination to write: where, its args.json and its record."""

    path: Path
    args: dict[str, Any]
    record: dict[str, Any]
    manifest: dict[str, Any]


def trial_groups(sweep_dir: str | Path) -> dict[tuple, list[Member]]:
    """The sweep's done runs per (dataset, algorithm, test_envs, trial_seed, protocol), by hparams_seed (the
    first one's data and splits evaluate the combination: under protocol domainbed each run has its own)."""
    root = Path(sweep_dir)
    if not root.is_dir():
        raise CombineError(f"input_dir {root} is not a directory; give a sweep directory")
    groups: dict[tuple, list[Member]] = {}
    for path in sorted(p for p in root.iterdir() if p.is_dir()):
        rundir = RunDirectory(path)
        args = rundir.read_args() if rundir.state() == DONE_STATE else None
        if args is None:
            continue
        key = (args["dataset"], args["algorithm"], tuple(sorted(args["test_envs"])), int(args["trial_seed"]),
               run_protocol(args))
        groups.setdefault(key, []).append(Member(path, args, rundir.records()))
    for members in groups.values():
        members.sort(key=lambda m: (int(m.args.get("hparams_seed", 0)), m.name))
    if not groups:
        raise CombineError(f"no finished runs in {root}; launch or resume the sweep first (domaingen sweep launch)")
    return groups


def _where(key: tuple) -> str:
    dataset, algorithm, test_envs, trial, _ = key
    return f"{algorithm} on {dataset} (test env {','.join(map(str, test_envs))}, trial {trial})"


def check_group(key: tuple, members: Sequence[Member], combiner: Combiner) -> None:
    """What can be checked from the records: a shared initialisation where weights are averaged,
    validation records where the combiner orders by them (CombineError, one line)."""
    if combiner.averages_weights:
        ids = {m.name: (m.records[0].get(INIT_FIELD) if m.records else None) for m in members}
        missing = [name for name, init in ids.items() if init is None]
        if missing:
            raise CombineError(
                f"{combiner.name}: run {missing[0]} of {_where(key)} did not start from a shared initialisation; "
                "average the runs of a sweep launched with shared_init = \"linear_probe\", or ask for "
                "--combiners ENS only")
        distinct = list(dict.fromkeys(ids.values()))
        if len(distinct) > 1:
            a, b = (next(n for n, i in ids.items() if i == init) for init in distinct[:2])
            raise CombineError(f"{combiner.name}: runs {a} and {b} of {_where(key)} start from different "
                               f"initialisations ({ids[a]}, {ids[b]}); average only runs that share one")
    if combiner.needs_validation:
        for member in members:
            if not math.isfinite(member.validation()):
                raise CombineError(
                    f"{combiner.name} adds runs in order of training-domain validation accuracy, but run "
                    f"{member.name} of {_where(key)} has no validation record (holdout_fraction 0?); leave "
                    f"{combiner.name} out of --combiners")


def _check_architecture(key: tuple, members: Sequence[Member], states: Sequence[dict[str, torch.Tensor]],
                        combiner: Combiner) -> None:
    shapes = [{name: tuple(value.shape) for name, value in state.items()} for state in states]
    for member, shape in zip(members[1:], shapes[1:]):
        if shape != shapes[0]:
            name = next(n for n in sorted(set(shape) | set(shapes[0])) if shape.get(n) != shapes[0].get(n))
            raise CombineError(
                f"{combiner.name}: runs {members[0].name} and {member.name} of {_where(key)} have different "
                f"architectures ({name}: {shapes[0].get(name)} and {shape.get(name)}); average runs of one architecture")


def _member_model(loaded: LoadedRun, member: Member, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The member's own model (its own hyperparameters) with `state` loaded, on the loaded run's device."""
    hparams = member.records[0].get("hparams", loaded.hparams) if member.records else loaded.hparams
    n_train = len(loaded.splits) - len(loaded.test_envs)
    model = type(loaded.algorithm)(loaded.dataset.input_shape, loaded.dataset.num_classes, n_train, hparams)
    model.load_state_dict(state)
    return place_model(model, loaded.device, loaded.dataset.input_shape).eval()


def combine(key: tuple, members: Sequence[Member], combiner: Combiner, sweep_dir: Path,
            data_dir: str | None = None, device: str = "auto") -> Combined:
    """The combination of one trial's runs by `combiner`, evaluated (written by `write`)."""
    loaded = load_run(members[0].path, combiner.checkpoint, data_dir, device)
    states = [dict(read_weights(RunDirectory(m.path), combiner.checkpoint)[1]) for m in members]
    if combiner.averages_weights:
        _check_architecture(key, members, states, combiner)
        model = loaded.algorithm

        def build(chosen: list[int]) -> torch.nn.Module:
            model.load_state_dict(average_states([states[i] for i in chosen]))
            return model
    else:
        models = [_member_model(loaded, m, s) for m, s in zip(members, states)]

        def build(chosen: list[int]) -> torch.nn.Module:
            return Ensemble([models[i] for i in chosen])

    precision = run_precision(loaded)
    n_envs, test_envs = len(loaded.splits), loaded.test_envs
    kwargs = dict(dataset=loaded.dataset, env_domains=loaded.env_domains)

    def validation(chosen: list[int]) -> float:
        only = {f"env{i}_out" for i in range(n_envs) if i not in test_envs}
        accuracies = evaluate(build(chosen), loaded.splits, loaded.device, precision, only=only, **kwargs)
        return training_validation_accuracy(accuracies, test_envs, n_envs)

    chosen = combiner.choose(list(range(len(members))), lambda i: members[i].validation(), validation)
    accuracies = evaluate(build(chosen), loaded.splits, loaded.device, precision,
                          extra={"idtest": loaded.idtest} if loaded.idtest else None, **kwargs)
    manifest = build_manifest(loaded.device, precision, used_libraries([loaded.algorithm, loaded.dataset]))
    return _combined(key, members, combiner, chosen, accuracies, sweep_dir, manifest)


def _combined(key: tuple, members: Sequence[Member], combiner: Combiner, chosen: list[int],
              accuracies: dict[str, float], sweep_dir: Path, manifest: dict[str, Any]) -> Combined:
    dataset, algorithm, test_envs, trial, protocol = key
    first = members[0]
    hparams = [m.records[0].get("hparams", {}) if m.records else {} for m in members]
    args = {
        "dataset": dataset, "algorithm": f"{algorithm} ({combiner.name})", "test_envs": list(test_envs),
        "hparams_seed": 0, "trial_seed": trial, "protocol": protocol,
        "holdout_fraction": first.args.get("holdout_fraction"), "in_domain_test": first.args.get("in_domain_test"),
        "combiner": combiner.name, "combined_algorithm": algorithm, "checkpoint": combiner.checkpoint,
        "members": [m.name for m in members], INIT_FIELD: first.records[0].get(INIT_FIELD) if first.records else None,
    }
    record = {
        "step": max(int(m.records[-1]["step"]) for m in members if m.records),
        **accuracies,
        "combined": [members[i].name for i in chosen],
        "n_combined": len(chosen),
        "data_source": first.records[-1].get("data_source") if first.records else None,
        # the hyperparameters every run shares (the backbone, say), for the tables' captions
        "hparams": {k: v for k, v in hparams[0].items() if all(h.get(k) == v for h in hparams[1:])},
        "args": args,
    }
    name = hashlib.md5(json.dumps([dataset, algorithm, list(test_envs), trial, protocol, combiner.name]).encode())
    return Combined(sweep_dir / COMBINED_DIR / name.hexdigest(), args, record, manifest)


def is_current(combined: Combined) -> bool:
    """Whether its directory holds this combination already (done, same args: the same runs combined)."""
    rundir = RunDirectory(combined.path)
    return rundir.state() == DONE_STATE and rundir.read_args() == json.loads(to_json(combined.args))


def write(combined: Combined) -> None:
    """Write one combination as a run directory: args.json, its record, its manifest, then `done`."""
    combined.path.mkdir(parents=True, exist_ok=True)
    (combined.path / DONE).unlink(missing_ok=True)
    atomic_write_bytes(combined.path / ARGS, (json.dumps(json.loads(to_json(combined.args)), indent=2) + "\n").encode())
    atomic_write_bytes(combined.path / RESULTS, (to_json(combined.record) + "\n").encode())
    atomic_write_bytes(combined.path / MANIFEST, (json.dumps(combined.manifest, indent=2, sort_keys=True) + "\n").encode())
    RunDirectory(combined.path).mark_done({"combined": combined.record["n_combined"]})


def average_sweep(sweep_dir: str | Path, combiners: Sequence[str] | None = None, data_dir: str | None = None,
                  device: str = "auto") -> list[tuple[Combined, bool]]:
    """Combine every trial of the sweep by each combiner (default: all), then write those that changed.

    Returns (combination, whether it was written). Raises CombineError, with nothing written, when
    some trial's runs cannot be combined as asked.
    """
    root = Path(sweep_dir)
    chosen = [COMBINERS.get(name) for name in (combiners or COMBINERS.names())]
    groups = trial_groups(root)
    for key, members in groups.items():
        for combiner in chosen:
            check_group(key, members, combiner)
    results = []
    for key, members in sorted(groups.items()):
        for combiner in chosen:
            log.info("%s: %s of %d runs", combiner.name, _where(key), len(members))
            results.append(combine(key, members, combiner, root, data_dir, device))
    written = [not is_current(c) for c in results]
    for combined, changed in zip(results, written):
        if changed:
            write(combined)
    return list(zip(results, written))
