"""The `mask-transfer` subcommand: Csordás et al.'s permuted-MNIST transfer experiment
(domaingen.inspect.mask_transfer), written as one JSON record; `collect mask-transfer` tabulates records."""

from __future__ import annotations

import argparse

from domaingen.errors import DomaingenError


# the defaults of TransferSettings, written out so that building the parser imports no torch
DEFAULTS = {"tasks": 11, "steps": 30000, "widths": "800,800,64", "lr": 0.01, "alpha": 0.00128, "mask_used_init": 2.0,
            "mask_new_init": 2.0, "mask_samples": 8, "batch_size": 128, "mask_biases": True, "grad_clip": 1.0, "seed": 0}


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `mask-transfer` to the `domaingen` command's subparsers."""
    d = DEFAULTS
    p = sub.add_parser("mask-transfer",
                       help="Csordás et al.'s transfer experiment: permutations of MNIST learnt in turn, each with "
                            "its own weight mask, earlier tasks' weights frozen; how much each task reuses")
    p.add_argument("--output", required=True, metavar="FILE.json", help="where to write the record")
    p.add_argument("--tasks", type=int, default=d["tasks"],
                   help=f"permutations p0 (identity), p1, ... learnt in turn (default {d['tasks']})")
    p.add_argument("--steps", type=int, default=d["steps"], help=f"training steps per task (default {d['steps']})")
    p.add_argument("--widths", default=d["widths"],
                   help=f"hidden-layer widths, comma-separated (default {d['widths']}: 784-800-800-64-10)")
    p.add_argument("--lr", type=float, default=d["lr"],
                   help=f"Adam learning rate of the weights and the mask logits (default {d['lr']:g})")
    p.add_argument("--alpha", type=float, default=d["alpha"],
                   help=f"weight of the sum of the mask logits in the loss (default {d['alpha']:g})")
    p.add_argument("--mask_used_init", type=float, default=d["mask_used_init"],
                   help=f"starting logit of the weights earlier tasks use (default {d['mask_used_init']:g})")
    p.add_argument("--mask_new_init", type=float, default=d["mask_new_init"],
                   help=f"starting logit of the other weights (default {d['mask_new_init']:g})")
    p.add_argument("--mask_samples", type=int, default=d["mask_samples"],
                   help=f"mask samples per step, each on its share of the batch (default {d['mask_samples']})")
    p.add_argument("--batch_size", type=int, default=d["batch_size"],
                   help=f"examples per step (default {d['batch_size']})")
    p.add_argument("--mask_biases", action=argparse.BooleanOptionalAction, default=d["mask_biases"],
                   help="mask the biases like the weights (default, the authors'); --no-mask_biases: unmasked, "
                        "trained by the first task only")
    p.add_argument("--grad_clip", type=float, default=d["grad_clip"],
                   help=f"global gradient-norm clip (default {d['grad_clip']:g}, the authors'; 0: none)")
    p.add_argument("--seed", type=int, default=d["seed"], help="seeds initialisation, batches and mask samples")
    p.add_argument("--data_dir", default=None,
                   help="the directory holding MNIST/raw, or embedded (default: $DOMAINGEN_DATA, else ./data)")
    p.add_argument("--train_examples", type=int, default=None, help="only the first N training digits (default: all)")
    p.add_argument("--test_examples", type=int, default=None, help="only the first N test digits (default: all)")


def run(ns: argparse.Namespace) -> int:
    """Run the experiment, write its record and print its tables."""
    from pathlib import Path

    from domaingen.datasets import resolve_data_dir
    from domaingen.inspect.mask_transfer import TransferSettings, check_settings, parse_widths, permuted_mnist_tasks, run_transfer
    import torch

    from domaingen.run.manifest import build_manifest
    from domaingen.run.rundir import atomic_write_bytes, to_json
    from domaingen.tables.mask_transfer_tables import render

    settings = TransferSettings(tasks=ns.tasks, steps=ns.steps, widths=parse_widths(ns.widths), lr=ns.lr,
                                alpha=ns.alpha, mask_used_init=ns.mask_used_init, mask_new_init=ns.mask_new_init,
                                mask_samples=ns.mask_samples, batch_size=ns.batch_size, mask_biases=ns.mask_biases,
                                grad_clip=ns.grad_clip, seed=ns.seed)
    check_settings(settings)
    task_data, source = permuted_mnist_tasks(resolve_data_dir(ns.data_dir), ns.train_examples, ns.test_examples)
    record = run_transfer(settings, task_data)
    record["data_source"] = source
    # what computed it: code version, libraries and machine, as a run's manifest.json has them
    record["manifest"] = build_manifest(torch.device("cpu"), "fp32")
    output = Path(ns.output)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(output, (to_json(record) + "\n").encode())
    except OSError as exc:
        raise DomaingenError(f"cannot write {output}: {exc.strerror}") from None
    print(render([record]))
    print(f"wrote {output} ({record['seconds']:.1f} s)")
    return 0
