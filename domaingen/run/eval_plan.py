"""Which splits a checkpoint evaluates (`--eval_splits`, `--train_in_every`).

No selection method and no table reads the training environments' `in` splits:
training-domain validation reads the training environments' `out` splits,
leave-one-domain-out reads the `in` split of an environment that its run holds
out, and the oracle and the reported accuracy read the test environments. With
`selection` every checkpoint evaluates every `out` split and the test
environments' `in` splits; the training environments' `in` splits are evaluated
at the last checkpoint only (the final-checkpoint table and the IRM paper's
"train accuracy" read them there), and at every k-th checkpoint with
`train_in_every` k, for learning curves. `all` evaluates every split at every
checkpoint, as DomainBed does.

With an in-domain test split (`--in_domain_test`), its splits `env{i}_idtest` (training
environments only) are an extra list of splits that every checkpoint evaluates
(`in_domain_test_names`): no selection reads them, the in-domain table reads them at
the checkpoint selection chose.
"""

from __future__ import annotations

from typing import Sequence

from domaingen.errors import DomaingenError

EVAL_SPLITS = ("selection", "all")
DEFAULT_EVAL_SPLITS = "selection"
# what a run started before runs recorded `eval_splits` evaluated
LEGACY_EVAL_SPLITS = "all"


def check_eval_splits(eval_splits: str | None, train_in_every: int | None) -> None:
    """Raise a one-line DomaingenError for an unknown `eval_splits` or a `train_in_every` below 1."""
    if eval_splits is not None and eval_splits not in EVAL_SPLITS:
        raise DomaingenError(f"unknown eval_splits {eval_splits!r}; choose one of {', '.join(EVAL_SPLITS)}")
    if train_in_every is not None and (isinstance(train_in_every, bool) or not isinstance(train_in_every, int)
                                       or train_in_every < 1):
        raise DomaingenError(
            f"train_in_every must be a positive integer (evaluate the training environments' in splits at every "
            f"k-th checkpoint), got {train_in_every!r}"
        )


def split_name(env: int, part: str) -> str:
    """'env{env}_{part}', the prefix of the split's record fields (part: in or out)."""
    return f"env{env}_{part}"


def in_domain_test_names(n_envs: int, test_envs: Sequence[int], in_domain_test: float | None) -> list[str]:
    """The in-domain test splits of a run, 'env{i}_idtest' per training environment; none when off."""
    if not in_domain_test:
        return []
    return [split_name(env, "idtest") for env in range(n_envs) if env not in set(test_envs)]


def is_checkpoint(step: int, steps: int, checkpoint_freq: int) -> bool:
    """Whether the training loop records a checkpoint after `step` (0-based) of `steps`."""
    return step % checkpoint_freq == 0 or step == steps - 1


def planned_splits(
    step: int,
    steps: int,
    checkpoint_freq: int,
    n_envs: int,
    test_envs: Sequence[int],
    eval_splits: str,
    train_in_every: int | None = None,
    extra_splits: Sequence[str] = (),
) -> list[str]:
    """The splits the checkpoint at `step` evaluates, as 'env{i}_{in|out}' in environment order,
    then `extra_splits` (the in-domain test splits, `in_domain_test_names`).

    The k-th checkpoints (train_in_every k) are those at steps that are multiples of
    k * checkpoint_freq, counting the one at step 0; the last checkpoint is always full.
    """
    check_eval_splits(eval_splits, train_in_every)
    last = step == steps - 1
    every = train_in_every is not None and step % (train_in_every * checkpoint_freq) == 0
    full = eval_splits == "all" or last or every
    held_out = set(test_envs)
    names = []
    for env in range(n_envs):
        if full or env in held_out:
            names.append(split_name(env, "in"))
        names.append(split_name(env, "out"))
    return names + list(extra_splits)


def evaluated_fraction(
    steps: int, checkpoint_freq: int, sizes: Sequence[tuple[int, int]], test_envs: Sequence[int],
    eval_splits: str, train_in_every: int | None = None,
) -> float:
    """Examples a run evaluates over all its checkpoints, as a fraction of evaluating every split at each.

    `sizes` holds (in, out) example counts per environment.
    """
    total = done = 0
    for step in range(steps):
        if not is_checkpoint(step, steps, checkpoint_freq):
            continue
        chosen = set(planned_splits(step, steps, checkpoint_freq, len(sizes), test_envs, eval_splits, train_in_every))
        for env, (n_in, n_out) in enumerate(sizes):
            total += n_in + n_out
            done += n_in * (split_name(env, "in") in chosen) + n_out * (split_name(env, "out") in chosen)
    return done / total if total else 1.0
