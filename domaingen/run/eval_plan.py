"""Which splits a checkpoint evaluates (`--eval_splits`, `--train_in_every`).

What each selection method reads, per run:

- training-domain validation: the training environments' `out` splits at every
  checkpoint, and the held-out environment's `in` split at the one it selects;
- the oracle: the held-out environment's `in` and `out` splits at the last checkpoint;
- leave-one-domain-out: in a run holding out two environments, each one's `in` split
  at every checkpoint; in the run holding out one, its `in` split at the checkpoint
  that the pair runs select (known only once every pair run is done);
- the final-checkpoint table: every split at the last checkpoint.

No method reads the training environments' `in` splits before the last checkpoint.

`final` (the default) evaluates that: at every checkpoint the training
environments' `out` splits, plus, in a run holding out two or more environments,
the held-out `in` and `out` splits (WILDS' official splits select on metrics over
both); the last checkpoint evaluates every split; and at the end
of the run a *final evaluation* loads the weights of the checkpoint that
training-domain validation selected (kept in selected.pt) and evaluates the held-out
splits there (see `run.selected`). The single runs of a sweep with pair runs need
their held-out `in` split at every checkpoint (leave-one-domain-out may pick any),
so a sweep launches them with `selection`. `selection` evaluates every `out` split
and the held-out `in` splits at every checkpoint, the training environments' `in`
splits at the last one. `all` evaluates every split at every checkpoint, as
DomainBed does. With `final` or `selection`, `train_in_every` k adds the training
environments' `in` splits at every k-th checkpoint, for learning curves.

With an in-domain test split (`--in_domain_test`), its splits `env{i}_idtest` (training
environments only, `in_domain_test_names`) are read by no selection method, only by the
in-domain table at the checkpoint that selection chose. Under `final` with one held-out
environment they are evaluated like the held-out splits: at the last checkpoint, at every
k-th checkpoint with `train_in_every` k (for curves), and by the final evaluation at each
selected checkpoint, for every prediction mode, the known-domain ones included. Otherwise
(`selection`, `all`, a run holding out several environments) every checkpoint evaluates them.
"""

from __future__ import annotations

from typing import Sequence

from domaingen.errors import DomaingenError

EVAL_SPLITS = ("final", "selection", "all")
DEFAULT_EVAL_SPLITS = "final"
# what a sweep's single runs use when the sweep also holds out pairs (leave-one-domain-out)
LOO_EVAL_SPLITS = "selection"
# what a run recorded without `eval_splits` evaluates, resumed too
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
    then `extra_splits` (the in-domain test splits, `in_domain_test_names`), which a run with a
    final evaluation (`defers_extra_splits`) evaluates only at its last and k-th checkpoints.

    The k-th checkpoints (train_in_every k) are those at steps that are multiples of
    k * checkpoint_freq, counting the one at step 0; the last checkpoint is always full.
    """
    check_eval_splits(eval_splits, train_in_every)
    if eval_splits == "all" or step == steps - 1:
        return [split_name(env, part) for env in range(n_envs) for part in ("in", "out")] + list(extra_splits)
    every = train_in_every is not None and step % (train_in_every * checkpoint_freq) == 0
    extras = list(extra_splits) if every or not defers_extra_splits(eval_splits, test_envs) else []
    held_out = set(test_envs)
    names = []
    for env in range(n_envs):
        if env in held_out:
            # a run holding out several environments (pairs; WILDS' official splits, whose selection
            # reads metrics over an environment's in and out splits together) evaluates them all
            if eval_splits == "selection" or len(held_out) > 1:
                names += [split_name(env, "in"), split_name(env, "out")]
        else:
            if every:
                names.append(split_name(env, "in"))
            names.append(split_name(env, "out"))
    return names + extras


def defers_extra_splits(eval_splits: str, test_envs: Sequence[int]) -> bool:
    """Whether a run makes a final evaluation (`final` with one held-out environment), which then
    also evaluates the extra splits (in-domain test) that its checkpoints before the last skip."""
    return eval_splits == "final" and len(test_envs) == 1


def evaluated_at_end(eval_splits: str, test_envs: Sequence[int], extra_splits: Sequence[str] = ()) -> list[str]:
    """The splits a run's final evaluation adds at its selected checkpoints (none unless `final`
    with one held-out environment: the held-out environment's `in` and `out` splits, then
    `extra_splits`, the in-domain test splits)."""
    if not defers_extra_splits(eval_splits, test_envs):
        return []
    return [split_name(test_envs[0], "in"), split_name(test_envs[0], "out"), *extra_splits]


def null_fields(evaluated: Sequence[str], test_envs: Sequence[int]) -> dict[str, None]:
    """Accuracy fields written as null at a checkpoint that did not evaluate them: the held-out
    environments' in and out accuracies. DomainBed's collect_results indexes these fields in
    every record (and counts environments by the `out` ones), so they are present, null."""
    names = (split_name(env, part) for env in test_envs for part in ("in", "out"))
    return {f"{name}_acc": None for name in names if name not in set(evaluated)}


def evaluated_fraction(
    steps: int, checkpoint_freq: int, sizes: Sequence[tuple[int, int]], test_envs: Sequence[int],
    eval_splits: str, train_in_every: int | None = None,
) -> float:
    """Examples a run evaluates over all its checkpoints, as a fraction of evaluating every split at each.

    `sizes` holds (in, out) example counts per environment. With `final` the final
    evaluation is counted as if it always ran (it is skipped when the last checkpoint is
    the selected one).
    """
    total = done = 0
    for name in evaluated_at_end(eval_splits, test_envs):
        env, part = int(name[3:name.index("_")]), name.rsplit("_", 1)[1]
        done += sizes[env][0 if part == "in" else 1]
    for step in range(steps):
        if not is_checkpoint(step, steps, checkpoint_freq):
            continue
        chosen = set(planned_splits(step, steps, checkpoint_freq, len(sizes), test_envs, eval_splits, train_in_every))
        for env, (n_in, n_out) in enumerate(sizes):
            total += n_in + n_out
            done += n_in * (split_name(env, "in") in chosen) + n_out * (split_name(env, "out") in chosen)
    return done / total if total else 1.0
