"""DomainBed's command-line flags, read as domaingen's: an alias where the meaning is the same, one
line naming what to do instead where domaingen has no equivalent.

DomainBed's scripts map to commands: `train.py` -> `domaingen train`, `sweep.py launch` ->
`domaingen sweep launch`, `sweep.py delete_incomplete` -> `domaingen sweep delete-incomplete`,
`collect_results.py` -> `domaingen collect`. Their shared flags (--dataset, --algorithm,
--test_envs, --hparams, --hparams_seed, --trial_seed, --seed, --steps, --checkpoint_freq,
--holdout_fraction, --data_dir, --output_dir, --datasets, --algorithms, --n_hparams,
--n_trials, --input_dir) have the same names and meanings; `DOMAINBED_FLAGS` holds the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from domaingen.errors import DomaingenError

COMMAND_LAUNCHERS = {"local": "local", "multi_gpu": "parallel", "dummy": "dry"}


@dataclass(frozen=True)
class Alias:
    """A DomainBed flag that means what `replace(value)` means here (`takes_value`: it has a value)."""

    takes_value: bool
    replace: Callable[[str | None], list[str]]


@dataclass(frozen=True)
class Refusal:
    """A DomainBed flag with no equivalent here: `message` says what to do instead."""

    message: str


def _launcher(value: str | None) -> list[str]:
    if value not in COMMAND_LAUNCHERS:
        raise DomaingenError(f"--command_launcher {value}: DomainBed's launchers are {', '.join(COMMAND_LAUNCHERS)}; "
                             "use --launcher with one of domaingen's (sweep launch --help)")
    return ["--launcher", COMMAND_LAUNCHERS[value]]


def _task(value: str | None) -> list[str]:
    if value != "domain_generalization":
        raise DomaingenError(f"--task {value}: domaingen runs domain generalization only; drop --task")
    return []


_TASK = Alias(True, _task)
_SWEEP = {
    "--skip_confirmation": Alias(False, lambda _: ["--yes"]),
    "--command_launcher": Alias(True, _launcher),
    "--single_test_envs": Alias(False, lambda _: ["--no-pairs"]),
    "--task": _TASK,
    "--n_hparams_from": Refusal("--n_hparams_from has no equivalent: a sweep runs hparams_seed 0 to n_hparams - 1, "
                                "and relaunching it with a larger --n_hparams runs only the new draws"),
    "--seed": Refusal("sweep launch takes no --seed (DomainBed's sweep ignores it too): each run's seed is derived "
                      "from its dataset, algorithm, test_envs, hparams_seed and trial_seed"),
}
DOMAINBED_FLAGS: dict[str, dict[str, Alias | Refusal]] = {
    "train": {
        "--task": _TASK,
        "--uda_holdout_fraction": Refusal("--uda_holdout_fraction has no equivalent: domaingen runs domain "
                                          "generalization only, with no unlabeled target data"),
        "--skip_model_save": Refusal("--skip_model_save has no equivalent: a run keeps checkpoint.pt to resume and "
                                     "selected.pt for its selected weights; `domaingen export --no_weights` "
                                     "bundles its records without them"),
        "--save_model_every_checkpoint": Refusal("--save_model_every_checkpoint has no equivalent: a run keeps its "
                                                 "last checkpoint and the weights each selection mode selects"),
    },
    "sweep launch": _SWEEP,
    "sweep delete-incomplete": _SWEEP,
    "collect": {
        "--latex": Alias(False, lambda _: ["--format", "latex"]),
        "--auto_lr": Refusal("--auto_lr has no equivalent: register the selection method you need in a plugin "
                             "(README: Adding an algorithm or a dataset) and pass it to --selection"),
    },
}


def command_of(argv: Sequence[str]) -> tuple[str, int]:
    """The command argv names ("train", "sweep launch", ...) and the index after it; ("", 0) when none."""
    words = [(i, token) for i, token in enumerate(argv) if not token.startswith("-")]
    if not words:
        return "", 0
    first, name = words[0]
    if name == "sweep" and len(words) > 1 and words[1][0] == first + 1:
        action = "delete-incomplete" if words[1][1] == "delete_incomplete" else words[1][1]
        return f"sweep {action}", first + 2
    return name, first + 1


def translate(argv: Sequence[str]) -> list[str]:
    """`argv` with DomainBed's flags replaced by domaingen's; raises DomaingenError (one line) for a
    DomainBed flag domaingen has no equivalent for. `sweep delete_incomplete` reads as `delete-incomplete`."""
    argv = list(argv)
    command, start = command_of(argv)
    if command.startswith("sweep ") and start >= 1 and argv[start - 1] == "delete_incomplete":
        argv[start - 1] = "delete-incomplete"
    table = DOMAINBED_FLAGS.get(command)
    if not table:
        return argv
    out, i = argv[:start], start
    while i < len(argv):
        flag, _, inline = argv[i].partition("=")
        entry = table.get(flag)
        if entry is None:
            out.append(argv[i])
            i += 1
            continue
        if isinstance(entry, Refusal):
            raise DomaingenError(entry.message)
        value = None
        if entry.takes_value:
            if inline:
                value = inline
            elif i + 1 < len(argv):
                value, i = argv[i + 1], i + 1
            else:
                raise DomaingenError(f"{flag} needs a value")
        out += entry.replace(value)
        i += 1
    return out
