"""The checkpoints that training-domain validation selects during a run, and the final evaluation.

During training a run keeps the weights of its best checkpoint so far by
training-domain validation (the mean `out` accuracy over the training environments,
computed as `tables.selection` computes it, so both pick the same checkpoint, the
earliest of equals): `selected.pt` for the algorithm's default prediction and, under
`--eval_splits final`, `selected_{mode}.pt` for each test-time mode that predicts on a
held-out environment (DMG's `mask_ens`), since a mode's table row selects its own
checkpoint; with in-domain test splits (`--in_domain_test`) also for the modes that
need the domain (known-domain prediction, `kd`), whose in-domain row reads them.

Under `final` the held-out environment, and the in-domain test splits, are not
evaluated before the last checkpoint. The *final evaluation*, after the last
checkpoint, loads each selected checkpoint's weights and evaluates the held-out `in`
and `out` splits there, and the in-domain test splits. It is written twice:
as a record of its own in `final.json` (which checkpoint, for which prediction mode,
its validation accuracy, the accuracies, the seconds it took), and into the selected
checkpoint's record in results.jsonl, whose null held-out fields it fills and whose
`evaluated_at_end` field lists the splits it added. `collect` (and DomainBed's own
collect_results) then read the selected checkpoint's accuracies where they read every
other field. A run interrupted before its final evaluation does it when resumed.
"""

from __future__ import annotations

import logging
import math
import re
import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import torch

from domaingen.algorithms.base import Algorithm
from domaingen.datasets.base import MultiDomainDataset
from domaingen.run.eval_plan import evaluated_at_end, in_domain_test_names
from domaingen.run.evaluation import Predict, evaluate, training_domains
from domaingen.run.rundir import FINAL, RunDirectory

if TYPE_CHECKING:  # run.training imports this module
    from domaingen.run.training import ResolvedRun

log = logging.getLogger(__name__)

DEFAULT_MODE = ""  # the algorithm's own predict


def training_validation_accuracy(record: Mapping[str, Any], test_envs: Sequence[int], n_envs: int,
                                 mode: str = DEFAULT_MODE) -> float:
    """Training-domain validation of one record: the mean `out` accuracy over the training
    environments in index order (NaN if one is missing), with the floating-point operations
    of `tables.selection`, so that the run and `collect` break exact ties alike."""
    suffix = f"_{mode}" if mode else ""
    values = [record.get(f"env{i}_out_acc{suffix}") for i in range(n_envs) if i not in set(test_envs)]
    if not values or any(v is None for v in values):
        return float("nan")
    return float(np.mean(np.asarray([values], dtype=float), axis=1)[0])


def selection_modes(algorithm: Algorithm, eval_splits: str, test_envs: Sequence[int],
                    in_domain_test: bool = False) -> list[str]:
    """The prediction modes whose selected checkpoint the run keeps: the default one always; under
    a final evaluation also each test-time mode defined on a held-out environment, and with
    in-domain test splits (which the final evaluation evaluates) every test-time mode."""
    if not evaluated_at_end(eval_splits, test_envs):
        return [DEFAULT_MODE]
    return [DEFAULT_MODE] + [mode for mode, needs_domain in algorithm.EVAL_MODES.items()
                             if in_domain_test or not needs_domain]


def stored_selection(stored: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The selection a checkpoint.pt holds, per mode (one not keyed by mode, holding a `step`, is the default mode's)."""
    if not stored:
        return {}
    if "step" in stored:
        return {DEFAULT_MODE: dict(stored)}
    return {mode: dict(chosen) for mode, chosen in stored.items()}


def update_selected(rundir: RunDirectory, record: Mapping[str, Any], test_envs: Sequence[int], n_envs: int,
                    algorithm: Algorithm, selected: dict[str, dict[str, Any]], modes: Sequence[str]) -> None:
    """Keep the weights of this checkpoint for each mode whose validation it improves strictly.

    Strictly: the earliest of equally good checkpoints stays selected, as in DomainBed's
    collect. `selected` (mode -> step and val_acc) is updated in place; `_save` keeps it in
    checkpoint.pt so that a resumed run compares against the same best.
    """
    weights = None
    for mode in modes:
        val_acc = training_validation_accuracy(record, test_envs, n_envs, mode)
        best = selected.get(mode)
        if not math.isfinite(val_acc) or (best is not None and val_acc <= best["val_acc"]):
            continue
        selected[mode] = {"step": int(record["step"]), "val_acc": val_acc}
        weights = algorithm.state_dict() if weights is None else weights
        rundir.save_selected({**selected[mode], "algorithm": type(algorithm).__name__, "model": weights}, mode)


def _mode_of(field: str, modes: Sequence[str]) -> str:
    """Which prediction mode an accuracy field belongs to ('env2_in_acc_mask_ens' -> 'mask_ens')."""
    for mode in modes:
        if mode and field.endswith(f"_acc_{mode}"):
            return mode
    return DEFAULT_MODE


def final_evaluation(run: ResolvedRun, dataset: MultiDomainDataset, device: torch.device,
                     rundir: RunDirectory, splits: list, algorithm: Algorithm, predict: Predict | None,
                     selected: Mapping[str, Mapping[str, Any]],
                     idtest: Sequence[Any] | None = None) -> None:
    """Evaluate the held-out splits, and the in-domain test splits `idtest` (one Split or None per
    environment; None: the run has none), at each selected checkpoint that is not the last (see
    the module docstring); nothing to do unless `eval_splits` is final, or when already done."""
    settings, test_envs = run.settings, run.test_envs
    extra_names = in_domain_test_names(len(splits), test_envs, settings.in_domain_test) if idtest else []
    names = evaluated_at_end(settings.eval_splits, test_envs, extra_names)
    if not names or rundir.file(FINAL).exists():
        return
    started = time.perf_counter()
    last = settings.steps - 1
    modes_at: dict[int, list[str]] = {}
    for mode, chosen in selected.items():
        if chosen["step"] != last:
            modes_at.setdefault(int(chosen["step"]), []).append(mode)
    every_mode = list(selected)
    entries, fills = [], {}
    env_domains = training_domains(len(splits), test_envs)
    for step, modes in sorted(modes_at.items()):
        state = rundir.load_selected(modes[0])
        if state is None or int(state["step"]) != step:
            raise RuntimeError(f"{rundir.path}: the kept weights of the selected step {step} are missing")
        algorithm.load_state_dict(state["model"])
        accuracies = evaluate(algorithm, splits, device, run.resolved_precision, dataset=dataset,
                              env_domains=env_domains, predict=predict, only=names,
                              extra={"idtest": idtest} if extra_names else None)
        kept = {k: v for k, v in accuracies.items() if _mode_of(k, every_mode) in modes}
        fills[step] = {**kept, "evaluated_at_end": names}
        entries.append({"step": step, "modes": [m or "default" for m in modes],
                        "val_acc": {m or "default": selected[m]["val_acc"] for m in modes}, **kept})
        log.info("final evaluation of step %d (%s): %s", step, ", ".join(m or "default" for m in modes),
                 " ".join(f"{k}={v:.4f}" for k, v in kept.items() if re.fullmatch(r"env\d+_(in|out|idtest)_acc\w*", k)))
    rundir.complete_records(fills)
    rundir.write_final({
        "evaluated": names,
        "selected_by": "training-domain validation (mean out accuracy over the training environments)",
        "last_step": last,
        "checkpoints": entries,
        "note": "the last checkpoint evaluated every split itself" if not entries else "",
        "seconds": time.perf_counter() - started,
    })
