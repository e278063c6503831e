"""Test-time adaptation: adapters that adapt a run's selected weights to unlabeled test batches.

`ADAPTERS` is the table of adapters (T3A, TentFull, TentNorm, TentPreBN, TentClf,
PseudoLabel, PLClf, SHOT, SHOTIM, the T3A fork's); a plugin adds one with
`register_adapter` on an `Adapter` subclass (its `GRID`, `USES_FEATURES` and `adapt`).
`adapt_run` adapts one run (`adapt.run`); `AdaptJob` is one run's adaptation as a job
any sweep launcher runs (`adapt.jobs`); `plan_adaptation` makes those jobs for a sweep's
runs not stored yet and `adapt_sweep` runs them (`adapt.sweep`); `collect` reads the
stored results as rows `X+ADAPTER`.
"""

from domaingen.adapt.base import ADAPTERS, Adapter, GradientAdapter, adapter_class, register_adapter, softmax_entropy
from domaingen.adapt import t3a, tent, pseudo_label  # noqa: F401, I001  (they register the built-in adapters, in the fork's order)
from domaingen.adapt.run import ADAPTED_PREFIX, TEST_BATCH_SIZE, adapt_run, adapted_file
from domaingen.adapt.jobs import AdaptJob
from domaingen.adapt.sweep import adapt_sweep, plan_adaptation

__all__ = ["ADAPTERS", "ADAPTED_PREFIX", "AdaptJob", "Adapter", "GradientAdapter", "TEST_BATCH_SIZE", "adapt_run",
           "adapt_sweep", "adapted_file", "adapter_class", "plan_adaptation", "register_adapter", "softmax_entropy"]
