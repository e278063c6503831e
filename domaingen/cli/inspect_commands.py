"""The `evaluate`, `diagnose` and `report` subcommands: argument handling and what the user sees."""

from __future__ import annotations

import argparse
import math
import re
from typing import Any, Mapping

from tabulate import tabulate

ACC_FIELD = re.compile(r"^env(\d+)_(in|out|idtest)_acc(?:_(\w+))?$")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add evaluate, diagnose and report to the `domaingen` command's subparsers."""
    p = sub.add_parser("evaluate", help="reload a run's selected (or last) model and print every environment's accuracy")
    _add_run_arguments(p)
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None,
                   help="evaluate in this precision (default: the one the run evaluated in); the last line then "
                        "says how far the accuracies move from the record")
    p.add_argument("--masks_x_domains", action="store_true",
                   help="also apply each training domain's mask (DMG) or head (MultiHead) to every environment, "
                        "with the Pred-Ens and Mask-Ens rows (DMG's Table 4); written to RUN_DIR/diagnostics.json "
                        "and drawn by `report`")

    p = sub.add_parser("diagnose", help="look inside a run's model: selectivity, activation rates, masks")
    _add_run_arguments(p)
    p.add_argument("--domain_masks", action="store_true",
                   help="also train one weight mask per training domain on the frozen weights (Csordás et al.)")
    p.add_argument("--mask_steps", type=int, default=None, help="--domain_masks: mask training steps per domain")
    p.add_argument("--mask_alpha", type=float, default=None,
                   help="--domain_masks: strength of the masks' sum-of-logits regulariser against the mean loss "
                        "(default 1e-5; Csordás et al.'s arithmetic tasks weigh 1e-4 / batch 128 against a per-digit mean, "
                        "1.5625e-6 against DigitMLP's two-digit loss); the "
                        "control mask (every training domain) shows whether it is too strong")
    p.add_argument("--mask_seed", type=int, nargs="+", default=None, metavar="SEED",
                   help="--domain_masks: seed the masks' training; two or more seeds train every domain's mask "
                        "once per seed and compare them (seed_stability: IoU between seeds)")
    p.add_argument("--max_examples", type=int, default=None,
                   help="examples per environment for activation statistics (default: 2000)")
    p.add_argument("--output", default=None, help="where to write diagnostics.json (default: RUN_DIR/diagnostics.json)")

    from domaingen.inspect.combiners import COMBINERS

    p = sub.add_parser("average", help="combine each trial's runs of a sweep (DiWA, soup, ENS) into runs that collect "
                                       "shows as rows X (LABEL)")
    p.add_argument("--input_dir", required=True, help="the sweep directory; writes INPUT_DIR/combined/")
    p.add_argument("--combiners", nargs="+", choices=COMBINERS.names(), default=None,
                   help="; ".join(f"{n}: {COMBINERS.get(n).description}" for n in COMBINERS.names()) + "; default: all")
    p.add_argument("--data_dir", default=None, help="default: the directory the runs were trained from")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")

    p = sub.add_parser("report", help="an HTML page of a sweep: tables, curves, masks, selectivity (needs the plots extra)")
    p.add_argument("sweep_dir")
    p.add_argument("--output", required=True, help="directory for index.html and its PNG figures")
    p.add_argument("--selection", default="training", help="selection method of the tables and the chosen runs")


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir")
    p.add_argument("--checkpoint", choices=["selected", "last"], default="selected",
                   help="selected: the weights training-domain validation chose (default); last: the last checkpoint")
    p.add_argument("--data_dir", default=None, help="default: the directory the run was trained from")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4f}"


def accuracy_table(accuracies: Mapping[str, float], env_names: list[str], test_envs: list[int]) -> str:
    """One row per environment: its in/out accuracy, then each test-time mode's."""
    modes: list[str] = []
    for key in accuracies:
        match = ACC_FIELD.match(key)
        if match and match.group(3) and match.group(3) not in modes:
            modes.append(match.group(3))
    # the in-domain test split (--in_domain_test) is a third column where the run has one
    parts = ("in", "out", "idtest") if any(k.endswith("_idtest_acc") for k in accuracies) else ("in", "out")
    headers = ["env", "name", "role", *parts] + [f"{s}_{m}" for m in modes for s in parts]
    rows = []
    for i, name in enumerate(env_names):
        row = [i, name, "test" if i in test_envs else "train", *(_fmt(accuracies.get(f"env{i}_{s}_acc")) for s in parts)]
        row += [_fmt(accuracies.get(f"env{i}_{s}_acc_{m}")) for m in modes for s in parts]
        rows.append(row)
    return tabulate(rows, headers=headers, disable_numparse=True)


def compare_with_record(accuracies: Mapping[str, float], record: Mapping[str, Any] | None) -> str:
    """One line: whether the accuracies equal the ones recorded at the checkpoint's step."""
    if record is None:
        return "no record of this step in results.jsonl to compare with"
    shared = [k for k, v in accuracies.items() if ACC_FIELD.match(k) and record.get(k) is not None and not math.isnan(v)]
    if not shared:
        return f"the record of step {record['step']} holds none of these accuracies"
    worst = max(shared, key=lambda k: abs(accuracies[k] - record[k]))
    gap = abs(accuracies[worst] - record[worst])
    if gap == 0:
        return f"equal to the record of step {record['step']} ({len(shared)} accuracies)"
    return f"differs from the record of step {record['step']} by up to {gap:.2g} ({worst})"


def matrix_table(matrix: Mapping[str, Any], unit: str = "mask") -> str:
    """The mask-by-domain matrix as text: a row per applied mask (or head), a column per environment (its split)."""
    headers = [unit] + [f"{name} ({which}{', test' if env in matrix['test_envs'] else ''})"
                          for env, (name, which) in enumerate(zip(matrix["columns"], matrix["splits"]))]
    rows = [[label, *(_fmt(v) for v in values)] for label, values in zip(matrix["rows"], matrix["accuracy"])]
    return tabulate(rows, headers=headers, disable_numparse=True)


def write_diagnostics_section(path: Any, key: str, value: Any) -> None:
    """Set one section of a run's diagnostics.json, keeping the others (`diagnose` keeps this one too)."""
    import json

    from domaingen.errors import DomaingenError
    from domaingen.run.rundir import atomic_write_bytes, to_json

    try:
        current = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        current = {}
    current[key] = value
    try:
        atomic_write_bytes(path, (to_json(current) + "\n").encode())
    except OSError as exc:
        raise DomaingenError(f"cannot write {path}: {exc.strerror}") from None


def evaluate_command(ns: argparse.Namespace) -> int:
    from domaingen.inspect.masks_x_domains import SECTION, applied, domain_mode, masks_x_domains
    from domaingen.run.reload import evaluate_run, load_run, run_precision

    loaded = load_run(ns.run_dir, ns.checkpoint, ns.data_dir, ns.device)
    if ns.masks_x_domains:
        domain_mode(loaded.algorithm)  # refuses, before anything is computed or written
    accuracies = evaluate_run(loaded, ns.precision)
    args = loaded.args
    print(f"{loaded.path}: {args['algorithm']} on {args['dataset']}, test envs {loaded.test_envs}, "
          f"{loaded.checkpoint} checkpoint (step {loaded.step}), data {loaded.dataset.data_source}, "
          f"evaluated in {ns.precision or run_precision(loaded)} (the run: {run_precision(loaded)})")
    print(accuracy_table(accuracies, [e.name for e in loaded.dataset.environments], loaded.test_envs))
    print(compare_with_record(accuracies, loaded.record()))
    if ns.masks_x_domains:
        matrix = masks_x_domains(loaded, ns.precision)
        output = loaded.path / "diagnostics.json"
        write_diagnostics_section(output, SECTION, matrix)
        unit = applied(args["algorithm"])
        print(f"\neach training domain's {unit} (known-domain prediction; rows) on every environment "
              "(columns: the split each reads)\n")
        print(matrix_table(matrix, unit))
        print(f"\nwrote the matrix to {output} ({SECTION})")
    return 0


COMMANDS = {"evaluate": evaluate_command}


def selectivity_table(result: Mapping[str, Any]) -> str:
    """Per layer: selectivity mean and quartiles on the training and the held-out environments, and activation rates."""
    rows = []
    for name, layer in result["layers"].items():
        row = [name, layer["neurons"]]
        for role in ("train", "test"):
            stats = layer.get(role)
            if stats is None:
                row += ["-", "-", "-"]
                continue
            sel = stats["selectivity"]
            row += [_fmt(sel["mean"]), f"{_fmt(sel['q25'])}/{_fmt(sel['median'])}/{_fmt(sel['q75'])}",
                    " ".join(_fmt(r) for r in stats["activation_rate_per_class"])]
        rows.append(row)
    headers = ["layer", "neurons", "sel train", "q25/med/q75 train", "active/class train",
               "sel test", "q25/med/q75 test", "active/class test"]
    return tabulate(rows, headers=headers, disable_numparse=True)


def domain_mask_table(masks: Mapping[str, Any]) -> str:
    """Csordás et al.'s tests: each mask's accuracy (inverted mask's in brackets) on every environment."""
    envs = [f"{name}{'*' if i in masks.get('test_envs', []) else ''}" for i, name in enumerate(masks["environments"])]
    rows = [[f"mask {d}"] + [f"{_fmt(a)} ({_fmt(b)})" for a, b in zip(acc, inv)]
            for d, acc, inv in zip(masks["domains"], masks["accuracy_matrix"], masks["inverted_accuracy_matrix"])]
    control = masks["control"]
    rows.append(["control (all)"] + [f"{_fmt(a)} ({_fmt(b)})" for a, b in zip(control["accuracy"], control["inverted_accuracy"])])
    rows.append(["unmasked"] + [_fmt(a) for a in masks["unmasked_accuracy"]])
    sharing = "; ".join(f"s({t},{r})={_fmt(masks['sharing'][i][j])}" for i, t in enumerate(masks["domains"])
                        for j, r in enumerate(masks["domains"]) if i != j)
    text = (f"domain masks (alpha {masks['alpha']:g}): accuracy per environment (* held out), inverted mask in "
            f"brackets; control keeps {_fmt(control['kept_fraction'])} of the weights\n"
            + tabulate(rows, headers=["mask", *envs], disable_numparse=True) + f"\nsharing {sharing}")
    if "kept_weights" in masks:
        text += "\n\n" + mask_layer_table(masks)
    if "seed_stability" in masks:
        stability = masks["seed_stability"]
        text += (f"\n\nmask stability over mask seeds {' '.join(map(str, stability['seeds']))}: IoU between seeds "
                 "(mean +- std over seed pairs; per layer, the mean)\n" + tabulate(
                     [[d, f"{_fmt(v['mean'])} +- {_fmt(v['std'])}", *(_fmt(x) for x in v["layers"].values())]
                      for d, v in stability["domains"].items()],
                     headers=["mask", "all weights", *next(iter(stability["domains"].values()))["layers"]],
                     disable_numparse=True))
    return text


def mask_layer_table(masks: Mapping[str, Any]) -> str:
    """Per layer, each domain mask's kept weights and the sharing s(t, r); then the weight ratios."""
    domains = masks["domains"]
    pairs = [(i, j) for i in range(len(domains)) for j in range(len(domains)) if i != j]
    rows = [[layer, entry["weights"], *entry["kept_weights"], *(_fmt(entry["sharing"][i][j]) for i, j in pairs)]
            for layer, entry in masks["layers"].items()]
    rows.append(["all", sum(e["weights"] for e in masks["layers"].values()), *masks["kept_weights"],
                 *(_fmt(masks["sharing"][i][j]) for i, j in pairs)])
    ratios = "; ".join(f"{domains[i]}/{domains[j]} = {masks['weight_ratio'][i][j]:.2f}" for i, j in pairs)
    return ("kept weights per layer and sharing s(t,r) = |t & r| / |t| (the share of t's weights r keeps too)\n"
            + tabulate(rows, headers=["layer", "weights", *(f"kept {d}" for d in domains),
                                      *(f"s({domains[i]},{domains[j]})" for i, j in pairs)], disable_numparse=True)
            + f"\nweight ratio (kept weights) {ratios}")


def section_tables(sections: Mapping[str, Any]) -> str:
    """Each algorithm section as a table of its layers' scalar fields (lists go to diagnostics.json only)."""
    parts = []
    for section, layers in sections.items():
        if not isinstance(layers, Mapping) or not layers:
            continue
        fields = [k for k, v in next(iter(layers.values())).items() if isinstance(v, (int, float)) or v is None]
        rows = [[name] + [v if isinstance(v, int) else _fmt(v) for v in (entry.get(k) for k in fields)]
                for name, entry in layers.items()]
        parts.append(f"{section}\n" + tabulate(rows, headers=["layer", *fields], disable_numparse=True))
    return "\n\n".join(parts)


def diagnose_command(ns: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from domaingen.inspect.diagnose import DEFAULT_MAX_EXAMPLES, diagnose
    from domaingen.errors import DomaingenError
    from domaingen.run.reload import load_run
    from domaingen.run.rundir import atomic_write_bytes, to_json

    from domaingen.inspect.diagnose import DEFAULT_MASK_STEPS, domain_weight_masks
    from domaingen.inspect.domain_masks import MASK_ALPHA, check_mask_options

    max_examples = DEFAULT_MAX_EXAMPLES if ns.max_examples is None else ns.max_examples
    if max_examples < 1:
        raise DomaingenError(f"--max_examples must be positive, got {max_examples}")
    steps = DEFAULT_MASK_STEPS if ns.mask_steps is None else ns.mask_steps
    if steps < 1:
        raise DomaingenError(f"--mask_steps must be positive, got {steps}")
    started = time.perf_counter()
    loaded = load_run(ns.run_dir, ns.checkpoint, ns.data_dir, ns.device)
    alpha = MASK_ALPHA if ns.mask_alpha is None else ns.mask_alpha
    seeds = list(ns.mask_seed or ())
    if ns.domain_masks:
        check_mask_options(len(loaded.splits) - len(loaded.test_envs), alpha, seeds)
    result = diagnose(loaded, max_examples)
    if ns.domain_masks:
        result["domain_masks"] = domain_weight_masks(loaded, steps, alpha=alpha, max_examples=max_examples,
                                                     mask_seeds=seeds)
    result["seconds"] = time.perf_counter() - started
    output = Path(ns.output) if ns.output else loaded.path / "diagnostics.json"
    result.update(_kept_sections(output))
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(output, (to_json(result) + "\n").encode())
    except OSError as exc:
        raise DomaingenError(f"cannot write {output}: {exc.strerror}") from None
    args = loaded.args
    print(f"{loaded.path}: {args['algorithm']} on {args['dataset']}, test envs {loaded.test_envs}, "
          f"{loaded.checkpoint} checkpoint (step {loaded.step}), up to {max_examples} examples per environment")
    print("\nneuron selectivity (mean, quartiles) and activation rate per class, training vs held-out environments\n")
    print(selectivity_table(result))
    sections = dict(result["sections"])
    if "domain_masks" in result:
        sections["domain_masks"] = result["domain_masks"]["layers"]
    if sections:
        print("\n" + section_tables(sections))
    if "domain_masks" in result:
        print("\n" + domain_mask_table(result["domain_masks"]))
    print(f"\nwrote {output} ({result['seconds']:.1f} s)")
    return 0


def _kept_sections(path: Any) -> dict[str, Any]:
    """Sections of an existing diagnostics.json that `evaluate` wrote (the mask-by-domain matrix): diagnose keeps them."""
    import json

    from domaingen.inspect.masks_x_domains import SECTION

    try:
        current = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        return {}
    return {SECTION: current[SECTION]} if isinstance(current, dict) and SECTION in current else {}


COMMANDS["diagnose"] = diagnose_command


def report_command(ns: argparse.Namespace) -> int:
    from domaingen.inspect.report import build_report
    from domaingen.cli.sweep_commands import load_recorded_plugins

    load_recorded_plugins(ns.sweep_dir)
    print(build_report(ns.sweep_dir, ns.output, ns.selection).message)
    return 0


COMMANDS["report"] = report_command


def average_command(ns: argparse.Namespace) -> int:
    from domaingen.cli.sweep_commands import load_recorded_plugins
    from domaingen.inspect.combine import average_sweep

    load_recorded_plugins(ns.input_dir)
    results = average_sweep(ns.input_dir, ns.combiners, ns.data_dir, ns.device)
    rows = [[c.args["dataset"], c.args["algorithm"], ",".join(map(str, c.args["test_envs"])), c.args["trial_seed"],
             f"{c.record['n_combined']} of {len(c.args['members'])}", "written" if changed else "unchanged"]
            for c, changed in results]
    print(tabulate(rows, headers=["dataset", "row", "test env", "trial", "runs combined", ""]))
    print(f"\n{sum(changed for _, changed in results)} written to {ns.input_dir}/combined; "
          f"`domaingen collect --input_dir {ns.input_dir}` shows them")
    return 0


COMMANDS["average"] = average_command
