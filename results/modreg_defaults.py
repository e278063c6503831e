"""The modreg_defaults sweep: training-domain validation of every (alpha, beta) draw.

Usage: python results/modreg_defaults.py SWEEP_DIR  (a run of sweeps/modreg_defaults.toml). Draws depend on
(algorithm, dataset, hparams_seed), so one hparams_seed is a different (alpha, beta) on each dataset.
"""
import json, sys
import pandas as pd
from domaingen.collect import collect
from domaingen.selection import training_domain_validation
c = collect(sys.argv[1])
per_run = training_domain_validation(c.records)
rows = []
for _, r in per_run.iterrows():
    recs = c.records[(c.records.dataset == r.dataset) & (c.records.hparams_seed == r.hparams_seed)]
    hp = json.loads(recs["hparams"].iloc[0]) if isinstance(recs["hparams"].iloc[0], str) else recs["hparams"].iloc[0]
    rows.append({"dataset": r.dataset, "hparams_seed": r.hparams_seed, "alpha": hp["modreg_alpha"], "beta": hp["modreg_beta"],
                 "val_acc": r.val_acc, "test_acc": r.test_acc, "step": int(r.step),
                 "kept_fraction_final": recs.sort_values("step")["modreg_kept_fraction"].iloc[-1]})
t = pd.DataFrame(rows).sort_values(["dataset", "hparams_seed"])
print(t.to_string(index=False))
