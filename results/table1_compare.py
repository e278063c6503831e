"""ModReg Table 1, MLP part: our final-step accuracies beside the published ones.

Usage: python results/table1_compare.py SWEEP_DIR  (a run of sweeps/modreg_table1.toml). Our cells are
mean ± sample std over restarts (the IRM paper's convention) with the standard error; the
published numbers are those quoted in the project's REFERENCE.md.
"""
import sys
import numpy as np
from tabulate import tabulate
from domaingen.collect import collect
from domaingen.selection import select
chosen = select(collect(sys.argv[1]).records, "last")
published = {  # IRM paper (Arjovsky et al. 2019, 10 restarts: train / test) and the ModReg abstract's MLP C-MNIST test
    "ERM": ("87.4", "17.1 ± 0.6", "34.27"), "IRM": ("70.8", "66.9 ± 2.5", "72.58"),
    "ERM+ModReg": ("", "", "36.91"), "IRM+ModReg": ("", "", "75.59"),
}
rows = []
for algorithm in ["ERM", "ERM+ModReg", "IRM", "IRM+ModReg"]:
    sub = chosen[chosen["algorithm"] == algorithm]
    fmt = lambda v: f"{100 * np.mean(v):.1f} ± {100 * np.std(v, ddof=1):.1f} (se {100 * np.std(v, ddof=1) / np.sqrt(len(v)):.1f})" if len(v) > 1 else (f"{100 * v[0]:.1f}" if len(v) else "-")
    rows.append([algorithm, len(sub), fmt(sub["indomain_acc"].to_numpy()), fmt(sub["test_acc"].to_numpy()), *published[algorithm]])
print(tabulate(rows, headers=["algorithm", "restarts", "train acc (ours)", "test acc (ours)", "train (IRM paper)",
                              "test (IRM paper)", "test (ModReg abstract, MLP)"], tablefmt="github", disable_numparse=True))
pairs = []
for base in ["ERM", "IRM"]:
    a = chosen[chosen.algorithm == base].set_index("trial_seed")["test_acc"]
    b = chosen[chosen.algorithm == f"{base}+ModReg"].set_index("trial_seed")["test_acc"]
    common = sorted(set(a.index) & set(b.index))
    if len(common) > 1:
        d = 100 * (b[common] - a[common]).to_numpy()
        pairs.append([f"{base}+ModReg - {base}", len(common), f"{d.mean():+.1f} ± {d.std(ddof=1) / np.sqrt(len(d)):.1f}"])
    elif len(common) == 1:
        pairs.append([f"{base}+ModReg - {base}", 1, f"{100 * (b[common[0]] - a[common[0]]):+.1f} (one restart)"])
print()
print(tabulate(pairs, headers=["test-accuracy difference, same restarts", "restarts", "mean ± se"], tablefmt="github", disable_numparse=True))
