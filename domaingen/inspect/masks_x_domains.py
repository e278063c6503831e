"""Every source domain's mask on every domain (`domaingen evaluate RUN --masks_x_domains`): DMG's Table 4.

For a model whose prediction takes a domain (DMG's masks, MultiHead's heads: an
`EVAL_MODES` entry that needs the domain index), row d applies training domain d's
mask (or head) to every example of every environment; the Pred-Ens row is the default
prediction and, where the algorithm has one, the Mask-Ens row its `mask_ens` mode.
Columns are every environment, held-out ones included. Each column reads one split:
a held-out environment its `in` split (what the test table reports), a training
environment its in-domain test split where the run has one (`--in_domain_test`), else its
`out` split (the validation split, which selection has seen: the output says which).
"""

from __future__ import annotations

from typing import Any

import torch

from domaingen.errors import DomaingenError
from domaingen.datasets.splits import Split
from domaingen.run.evaluation import split_accuracy
from domaingen.run.reload import LoadedRun, run_precision

SECTION = "masks_x_domains"
ENSEMBLE_ROWS = (("Pred-Ens", None), ("Mask-Ens", "mask_ens"))
HEAD_ALGORITHMS = ("MultiHead",)  # their domain-taking prediction picks a head, not a mask


def applied(algorithm: str) -> str:
    """What row d of the matrix applies to every example: domain d's "head" (MultiHead) or "mask" (DMG)."""
    return "head" if algorithm in HEAD_ALGORITHMS else "mask"


def domain_mode(algorithm: Any) -> str:
    """The test-time mode that takes the examples' domain; a DomaingenError when the algorithm has none."""
    modes = [mode for mode, needs_domain in getattr(algorithm, "EVAL_MODES", {}).items() if needs_domain]
    if not modes:
        raise DomaingenError(
            f"--masks_x_domains needs an algorithm whose prediction takes a domain (DMG, MultiHead); "
            f"{type(algorithm).__name__} has none: evaluate it without --masks_x_domains")
    return modes[0]


def column_splits(loaded: LoadedRun) -> list[tuple[str, Split]]:
    """Per environment, (which split, the split) that its column reads."""
    columns = []
    for env, (split_in, split_out) in enumerate(loaded.splits):
        if env in loaded.test_envs:
            columns.append(("in", split_in))
        elif loaded.idtest and loaded.idtest[env] is not None:
            columns.append(("idtest", loaded.idtest[env]))
        else:
            columns.append(("out", split_out))
    return columns


def masks_x_domains(loaded: LoadedRun, precision: str | None = None) -> dict[str, Any]:
    """The matrix: {'rows', 'columns', 'splits', 'accuracy' (rows x columns), 'examples', 'train_rows'}.

    Rows: the training domains (by environment name), then Pred-Ens and, where defined, Mask-Ens.
    """
    algorithm = loaded.algorithm
    mode = domain_mode(algorithm)
    precision = precision or run_precision(loaded)
    names = [env.name for env in loaded.dataset.environments]
    train_envs = [env for env, domain in enumerate(loaded.env_domains) if domain is not None]
    columns = column_splits(loaded)
    rows: list[tuple[str, str | None, int | None]] = [(names[env], mode, loaded.env_domains[env]) for env in train_envs]
    rows += [(label, row_mode, None) for label, row_mode in ENSEMBLE_ROWS
             if row_mode is None or row_mode in getattr(algorithm, "EVAL_MODES", {})]
    was_training = algorithm.training
    algorithm.eval()
    try:
        with torch.inference_mode():
            accuracy = [
                [split_accuracy(algorithm, split, loaded.device, precision, mode=row_mode, domain=domain)
                 for _, split in columns]
                for _, row_mode, domain in rows
            ]
    finally:
        algorithm.train(was_training)
    return {
        "rows": [label for label, _, _ in rows],
        "columns": names,
        "splits": [which for which, _ in columns],
        "test_envs": list(loaded.test_envs),
        "train_rows": len(train_envs),
        "accuracy": accuracy,
        "examples": [len(split) for _, split in columns],
        "mode": mode,
        "checkpoint": loaded.checkpoint,
        "step": loaded.step,
    }
