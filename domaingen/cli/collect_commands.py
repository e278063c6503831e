"""`domaingen collect`: a sweep's result tables, or one other view of its runs.

`domaingen collect --input_dir DIR ...` prints the tables (the view `tables`, which may also
be named); `domaingen collect VIEW --input_dir DIR ...` prints another view, and takes only
that view's options, so argparse refuses any other. VIEWS holds the views: a view is one
entry there (its help, the options it takes and what it runs). The options several views
share are declared once, below, and each view adds those it reads. Building the parser
imports nothing heavy: each view imports what it computes with when it runs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from domaingen.errors import DomaingenError

ALL_FORMATS = ("markdown", "latex", "csv")
PLAIN_FORMATS = ("markdown", "csv")
DEFAULT_VIEW = "tables"


# ---- options shared by several views ----

def _add_input(p: argparse.ArgumentParser, formats: Sequence[str] = ALL_FORMATS, several: bool = False) -> None:
    """What every view reads and writes: the runs (--input_dir, narrowed by --datasets, --algorithms and --protocol),
    the output.
    With `several`, --input_dir takes several sources, each one's rows labelled."""
    what = ("a sweep directory, a run directory, or a bundle (domaingen export's FILE.zip or its unpacked folder)")
    if several:
        p.add_argument("--input_dir", required=True, nargs="+", metavar="[LABEL=]DIR",
                       help=what + "; several side by side: each one's algorithms become rows 'ALGORITHM (LABEL)' "
                                   "(LABEL: the directory's or bundle's name unless given)")
    else:
        p.add_argument("--input_dir", required=True, help=what)
    p.add_argument("--format", choices=list(formats), default="markdown")
    p.add_argument("--output", default=None, help="write here instead of stdout")
    p.add_argument("--datasets", nargs="+", metavar="DATASET",
                   help="only these datasets' runs (e.g. one part of a sweep whose parts differ in their datasets)")
    p.add_argument("--algorithms", nargs="+", metavar="ALGORITHM",
                   help="only these algorithms' runs, by exact name (IRM keeps IRM, not IRM+ModReg)")
    p.add_argument("--protocol", default=None,
                   help="only the runs of this protocol (paired or domainbed); needed when a directory holds "
                        "both: a table never mixes them")
    p.add_argument("--allow_mixed_sources", action="store_true",
                   help="tabulate runs of one dataset that come from different data sources together "
                        "(default: refuse; the captions then name every source)")


def _add_selection(p: argparse.ArgumentParser) -> None:
    from domaingen.tables.selection import selection_method_names, selection_methods_help

    p.add_argument("--selection", nargs="+", choices=selection_method_names(), default=None,
                   help=selection_methods_help())


def _add_hparams_choice(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hparams_choice", default="per_trial",
                   help="per_trial (default, DomainBed's): per trial, the hparams draw with the best validation "
                        "accuracy; pooled: one draw per cell, by validation accuracy averaged over trials")


def _add_error(p: argparse.ArgumentParser) -> None:
    p.add_argument("--error", choices=["domainbed", "se", "std"], default="domainbed",
                   help="what ± shows: DomainBed's std(x/sqrt(n)) with ddof 0 (default), the sample "
                        "standard error (ddof 1) or the sample standard deviation over trials")


def _add_table_layout(p: argparse.ArgumentParser) -> None:
    """--show_trials and --bare: how accuracy tables are printed."""
    p.add_argument("--show_trials", action="store_true", help="append the number of trials to each cell")
    p.add_argument("--bare", action="store_true",
                   help="latex: tables only, for \\input in a paper (the packages they need are named at the top)")
    p.add_argument("--long_captions", action="store_true",
                   help="latex: captions with the selection rule, data source and protocol spelled out (default: "
                        "short captions; the notes under the first table say the rest)")


def _add_fields(p: argparse.ArgumentParser, required: bool, text: str) -> None:
    p.add_argument("--fields", nargs="+", default=None, metavar="GLOB", required=required, help=text)


def _check_hparams_choice(ns: argparse.Namespace) -> None:
    from domaingen.tables.selection import check_hparams_choice

    check_hparams_choice(ns.hparams_choice)


# ---- tables flags that ask for another view: each stops with one line giving that view's command ----

MOVED = {
    "--top_hparams": "domaingen collect top-hparams --input_dir DIR",
    "--trajectories": "domaingen collect trajectories --input_dir DIR --fields GLOB ...",
    "--draws": "domaingen collect draws --input_dir DIR",
    "--versus": "domaingen collect versus --input_dir DIR --other DIR",
    "--masks_x_domains": "domaingen collect masks-x-domains --input_dir DIR",
    "--manifest": "domaingen collect manifest --input_dir DIR",
}


class _Moved(argparse.Action):
    """A flag of MOVED: exit 2 with one line giving the command of the view it asks for."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        flag = self.option_strings[0]
        parser.exit(2, f"domaingen: error: {flag} is now '{MOVED[flag]}'\n")


def _add_split_by(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--split_by", nargs="+", default=[], metavar="HPARAM",
                   help=f"{what}: runs that have them are named 'ALGORITHM (HPARAM=value, ...)' (a grid "
                        "spec's points apart, the defaults among them)")


# ---- the views ----

def _tables_arguments(p: argparse.ArgumentParser) -> None:
    _add_input(p, several=True)
    _add_selection(p)
    _add_hparams_choice(p)
    _add_error(p)
    _add_table_layout(p)
    p.add_argument("--reference", nargs="+", default=None, metavar="FILE.csv|NAME",
                   help="published numbers to add as rows labelled with their source (columns: dataset, algorithm, "
                        "test_env or Avg, mean, error, source; optional selection, table): a CSV file, or the name of "
                        "one shipped with domaingen: domainbed_mnist, domainbed_images (DomainBed's published cells), "
                        "modreg_table1, dmg, pacs_modern")
    p.add_argument("--paired", nargs="*", default=None, metavar="ALGORITHM:BASE",
                   help="also tabulate paired differences of test accuracy, ALGORITHM minus BASE over the trials "
                        "both have (same trial_seed: the same restart), each cell with a paired test's Holm-adjusted "
                        "p; no pairs given: every X+Y beside its X")
    _add_split_by(p, "one row per value of these hyperparameters")
    p.add_argument("--baseline", default=None, metavar="ALGORITHM",
                   help="also tabulate every other algorithm minus this one, paired by trial_seed, as --paired "
                        "does: each cell with a paired test's Holm-adjusted p")
    p.add_argument("--paired_over", default="trials", choices=("trials", "draws"),
                   help="what --paired and --baseline pair: 'trials' (default), each table's selected trials by "
                        "trial_seed; 'draws', every run of every hparams draw at the checkpoint the selection rule "
                        "picks within it, by (hparams_seed, trial_seed) (protocol paired only)")
    p.add_argument("--test", choices=["auto", "t", "wilcoxon"], default="auto",
                   help="the paired test of --paired and --baseline cells: 'auto' (default), the exact Wilcoxon "
                        "signed-rank test with 6 pairs or more, else the paired t-test; 't' or 'wilcoxon' for every "
                        "n (with n pairs the signed-rank test's p is at least 2/2^n, times Holm's multiplier)")
    _add_fields(p, False, "also tabulate record fields matching these globs (e.g. 'modreg_*_kept_fraction') at "
                          "each trial's selected checkpoint, mean ± error over trials ('step': the step selected)")
    for flag in MOVED:
        p.add_argument(flag, nargs="*", action=_Moved, help=argparse.SUPPRESS)


def _tables(ns: argparse.Namespace) -> int:
    import pandas as pd

    from domaingen.cli.sweep_commands import _collection, _methods, _write
    from domaingen.tables.comparisons import (baseline_pairs, check_paired_over, field_tables, paired_tables,
                                              parse_pairs)
    from domaingen.tables.reference import read_reference
    from domaingen.tables.collect import split_by_hparams
    from domaingen.tables.reporting import build_tables, to_csv, to_latex, to_markdown
    from domaingen.tables.selection import pair_methods_left_out

    _check_hparams_choice(ns)
    pairs = parse_pairs(ns.paired)
    if ns.paired_over != "trials" and pairs is None and not ns.baseline:
        raise DomaingenError(f"--paired_over {ns.paired_over} says what --paired or --baseline pairs; add one of them")
    reference = pd.concat([read_reference(f) for f in ns.reference], ignore_index=True) if ns.reference else None
    collection = _collection(ns.input_dir, ns)
    if ns.split_by:
        collection = split_by_hparams(collection, ns.split_by)
    check_paired_over(ns.paired_over, collection.protocol)
    methods = _methods(collection, ns.selection, collection.bundle)
    tables = build_tables(collection, methods, ns.hparams_choice, reference)
    if ns.baseline:
        pairs = (pairs or []) + [pair for pair in baseline_pairs(tables, ns.baseline) if pair not in (pairs or [])]
    if ns.test != "auto" and pairs is None and not ns.baseline:
        raise DomaingenError(f"--test {ns.test} says how --paired or --baseline cells are tested; add one of them")
    derived = paired_tables(tables, pairs, ns.paired_over, collection, ns.test) if pairs is not None else []
    derived += field_tables(tables, collection.records, ns.fields) if ns.fields else []
    tables += derived
    note = "" if ns.selection or collection.bundle is not None else pair_methods_left_out(_has_pairs(collection))
    if ns.format == "markdown":
        text = to_markdown(tables, collection, ns.show_trials, ns.error) + (f"\n{note}\n" if note else "")
    elif ns.format == "latex":
        text = to_latex(tables, collection, ns.show_trials, ns.bare, ns.error, long_captions=ns.long_captions)
    else:
        text = to_csv(tables, ns.error)
    if note and ns.format != "markdown":
        print(note, file=sys.stderr)
    return _write(text, ns.output)


def _has_pairs(collection) -> bool:
    return bool(len(collection.records)) and bool((collection.records["test_envs"].map(len) == 2).any())


def _top_hparams_arguments(p: argparse.ArgumentParser) -> None:
    _add_input(p, PLAIN_FORMATS)
    _add_selection(p)
    _add_hparams_choice(p)
    p.add_argument("--fields", nargs="+", default=[], metavar="GLOB",
                   help="also the selected checkpoint's recorded fields matching these globs, a column each "
                        "(e.g. 'modreg_*kept_fraction' train_acc)")
    _add_split_by(p, "one table per value of these hyperparameters, as `collect tables --split_by` has rows")


def _top_hparams(ns: argparse.Namespace) -> int:
    from domaingen.cli.sweep_commands import _collection, _methods, _write
    from domaingen.tables.collect import split_by_hparams
    from domaingen.tables.top_hparams import top_hparams_csv, top_hparams_markdown

    _check_hparams_choice(ns)
    collection = _collection(ns.input_dir, ns)
    if ns.split_by:
        collection = split_by_hparams(collection, ns.split_by)
    methods = _methods(collection, ns.selection, collection.bundle)
    render = top_hparams_csv if ns.format == "csv" else top_hparams_markdown
    return _write(render(collection, methods, ns.hparams_choice, ns.fields), ns.output)


def _trajectories_arguments(p: argparse.ArgumentParser) -> None:
    _add_input(p, PLAIN_FORMATS, several=True)
    _add_fields(p, True, "the record fields to follow, as globs (e.g. 'modreg_*kept_fraction')")


def _trajectories(ns: argparse.Namespace) -> int:
    from domaingen.cli.sweep_commands import _collection, _write
    from domaingen.tables.views import render, trajectories

    collection = _collection(ns.input_dir, ns)
    text = render(trajectories(collection.records, ns.fields), "mean over runs at each checkpoint", ns.format)
    return _write(text, ns.output)


def _draws_arguments(p: argparse.ArgumentParser) -> None:
    _add_input(p, PLAIN_FORMATS)
    _add_fields(p, False, "also these record fields (globs) at each run's last checkpoint")


def _draws(ns: argparse.Namespace) -> int:
    from domaingen.cli.sweep_commands import _collection, _write
    from domaingen.tables.views import draws_table, render

    collection = _collection(ns.input_dir, ns)
    text = render(draws_table(collection.records, ns.fields),
                  "every hparams draw, training-domain validation (accuracies in %)", ns.format)
    return _write(text, ns.output)


def _selected_tables(ns: argparse.Namespace):
    """What the views over selected runs share: the collection, its selection methods and their tables."""
    from domaingen.cli.sweep_commands import _collection, _methods
    from domaingen.tables.reporting import build_tables

    _check_hparams_choice(ns)
    collection = _collection(ns.input_dir, ns)
    methods = _methods(collection, ns.selection, collection.bundle)
    return collection, methods, build_tables(collection, methods, ns.hparams_choice)


def _correlations_arguments(p: argparse.ArgumentParser) -> None:
    _add_input(p, PLAIN_FORMATS)
    _add_selection(p)
    _add_hparams_choice(p)
    _add_fields(p, True, "the record fields whose relation to --against to measure, as globs")
    p.add_argument("--against", nargs="+", required=True, metavar="GLOB",
                   help="the fields (globs) whose mean is the quantity to predict, e.g. 'fc_acc_s0.5' 'fc_acc_s1'")
    p.add_argument("--without", nargs="+", default=[], metavar="ALGORITHM", help="leave these algorithms out")


def _correlations(ns: argparse.Namespace) -> int:
    from domaingen.cli.sweep_commands import _write
    from domaingen.tables.correlations import correlation_tables, title
    from domaingen.tables.comparisons import matching_fields
    from domaingen.tables.views import render

    collection, methods, tables = _selected_tables(ns)
    result = correlation_tables(tables, collection.records, ns.fields, ns.against, ns.without)
    text = render(result, title(matching_fields(collection.records, ns.against, by_pattern=False), ns.without), ns.format,
                  key_names=("dataset", "selection"))
    return _write(text, ns.output)


def _versus_arguments(p: argparse.ArgumentParser) -> None:
    _add_input(p)
    p.add_argument("--other", required=True, metavar="DIR",
                   help="the sweep to compare with: launched with the same seeds and one setting changed "
                        "(e.g. --precision); differences are --input_dir's runs minus its twins here")
    _add_selection(p)
    _add_hparams_choice(p)
    _add_error(p)
    _add_table_layout(p)


def _versus(ns: argparse.Namespace) -> int:
    from domaingen.cli.sweep_commands import _collection, _methods, _versus_text, _write

    _check_hparams_choice(ns)
    if Path(ns.other).resolve() == Path(ns.input_dir).resolve():
        raise DomaingenError(f"--other {ns.other} is the --input_dir itself; name another sweep directory")
    collection = _collection(ns.input_dir, ns)
    methods = _methods(collection, ns.selection, collection.bundle)
    return _write(_versus_text(collection, methods, ns), ns.output)


def _masks_x_domains_arguments(p: argparse.ArgumentParser) -> None:
    _add_input(p, PLAIN_FORMATS)
    _add_hparams_choice(p)
    _add_error(p)


def _masks_x_domains(ns: argparse.Namespace) -> int:
    from domaingen.cli.sweep_commands import _collection, _write
    from domaingen.inspect.masks_over_trials import masks_matrix_tables, matrix_text
    from domaingen.tables.diagnostics import runs_directory

    _check_hparams_choice(ns)
    collection = _collection(ns.input_dir, ns)
    with runs_directory(ns.input_dir) as root:
        tables = masks_matrix_tables(collection, root, ns.hparams_choice)
    return _write(matrix_text(tables, ns.format, ns.error), ns.output)


def _domain_masks_arguments(p: argparse.ArgumentParser) -> None:
    _add_input(p)
    _add_error(p)
    p.add_argument("--reference", default="csordas", metavar="FILE.csv|NAME",
                   help="the published numbers beside ours (columns: dataset, quantity, mean, error, claim, source): "
                        "a CSV file, or a shipped one's name (default: csordas, Csordás et al.'s)")
    _add_split_by(p, "tables per value of these hyperparameters")


def _domain_masks(ns: argparse.Namespace) -> int:
    from domaingen.cli.sweep_commands import _collection, _write
    from domaingen.tables.collect import split_by_hparams
    from domaingen.tables.diagnostics import runs_directory
    from domaingen.tables.domain_mask_tables import domain_mask_tables, render

    collection = _collection(ns.input_dir, ns)
    if ns.split_by:
        collection = split_by_hparams(collection, ns.split_by)
    with runs_directory(ns.input_dir) as root:
        tables = domain_mask_tables(collection, root, ns.reference)
    return _write(render(tables, ns.format, ns.error), ns.output)


def _verdict_arguments(p: argparse.ArgumentParser) -> None:
    _add_input(p, PLAIN_FORMATS, several=True)
    p.add_argument("--claims", nargs="+", default=["modreg_claims"], metavar="FILE.csv|NAME",
                   help="the published gains to judge (columns: claim, dataset, test_env, featurizer, base, method, "
                        "base_mean, method_mean, selection, source; optional: compare, other datasets with the same "
                        "environments whose base runs the protocols table lists): CSV files, or shipped ones' names "
                        "(default: modreg_claims, the ModReg abstract's; also shipped: sandmask_claims)")
    p.add_argument("--split_by", nargs="+", default=[], metavar="HPARAM",
                   help="the hyperparameters a grid varies: each point of the method becomes a row (the defaults "
                        "are the row whose values are the method's defaults)")
    p.add_argument("--defaults", nargs="+", default=[], metavar="HPARAM=VALUE",
                   help="split values that also stand for the defaults (a grid point that runs the method's "
                        "defaults under other names, e.g. modreg_scale=0.1 modreg_alpha=6.93e-09)")
    p.add_argument("--test", choices=["t", "wilcoxon", "auto"], default="t",
                   help="each point's paired test, Holm-adjusted over the claim's tested points: 't' (default), the "
                        "paired t-test, whose interval the verdict reads; 'wilcoxon', the exact signed-rank test, "
                        "whose p at n pairs is at least 2/2^n (times Holm's multiplier: at ten pairs, a grid of 26 "
                        "tested points can never reject); 'auto', wilcoxon with 6 pairs or more, else t")
    p.add_argument("--also_test", choices=["t", "wilcoxon", "auto"], default=None,
                   help="also judge every claim with this test and add its verdicts (a table after the others; "
                        "in CSV, rows whose test column names it): how much the verdicts owe to the choice of test")


def _verdict(ns: argparse.Namespace) -> int:
    from domaingen.cli.sweep_commands import _collection, _write, labelled_sources
    from domaingen.tables.verdict import (judge_sources, parse_equivalents, read_claims_files, verdict_csv,
                                          verdict_markdown)

    claims = read_claims_files(ns.claims)
    equivalents = parse_equivalents(ns.defaults, ns.split_by)
    sources = list(ns.input_dir)
    loaded = ([("", _collection(sources[0], ns))] if len(sources) == 1 else
              [(label, _collection(path, ns)) for label, path in labelled_sources(sources)])
    verdicts, protocols = judge_sources(claims, loaded, ns.split_by, equivalents, ns.test)
    also = None
    if ns.also_test is not None:
        if ns.also_test == ns.test:
            raise DomaingenError(f"--also_test {ns.also_test} is --test's own; name another test (t, wilcoxon or auto)")
        also = (ns.also_test, judge_sources(claims, loaded, ns.split_by, equivalents, ns.also_test)[0])
    if ns.format == "csv":
        return _write(verdict_csv(verdicts, ns.test, also), ns.output)
    return _write(verdict_markdown(verdicts, protocols, ns.test, also), ns.output)


def _mask_transfer_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", required=True, nargs="+", metavar="FILE.json",
                   help="records of `domaingen mask-transfer`, one per seed, of one setting (not a sweep: this view "
                        "takes no --input_dir)")
    p.add_argument("--format", choices=list(PLAIN_FORMATS), default="markdown")
    p.add_argument("--output", default=None, help="write here instead of stdout")


def _mask_transfer(ns: argparse.Namespace) -> int:
    from domaingen.cli.sweep_commands import _write
    from domaingen.tables.mask_transfer_tables import read_records, render

    return _write(render(read_records(ns.records), ns.format), ns.output)


def _manifest_arguments(p: argparse.ArgumentParser) -> None:
    _add_input(p, PLAIN_FORMATS)


def _manifest(ns: argparse.Namespace) -> int:
    from domaingen.cli.sweep_commands import _collection, _write
    from domaingen.tables.provenance import manifest_summary

    collection = _collection(ns.input_dir, ns)
    return _write(manifest_summary(collection, ns.format), ns.output)


def _ranks_arguments(p: argparse.ArgumentParser) -> None:
    _add_input(p)
    _add_selection(p)
    _add_hparams_choice(p)
    p.add_argument("--alpha", type=float, default=0.05, help="the Nemenyi critical difference's level (default 0.05)")


def _ranks(ns: argparse.Namespace) -> int:
    from domaingen.cli.sweep_commands import _write
    from domaingen.tables.across_datasets import ranks, render

    collection, methods, tables = _selected_tables(ns)
    return _write(render(ranks(tables, methods, ns.alpha), ns.format), ns.output)


def _intervals_arguments(p: argparse.ArgumentParser) -> None:
    _add_input(p)
    _add_selection(p)
    _add_hparams_choice(p)
    p.add_argument("--reps", type=int, default=2000, help="bootstrap replicates (default 2000)")
    p.add_argument("--confidence", type=float, default=0.95, help="the intervals' level (default 0.95)")
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's random seed (default 0)")


def _intervals(ns: argparse.Namespace) -> int:
    from domaingen.cli.sweep_commands import _write
    from domaingen.tables.across_datasets import intervals, render

    collection, methods, tables = _selected_tables(ns)
    summaries = intervals(tables, methods, ns.reps, ns.confidence, ns.seed)
    return _write(render(summaries, ns.format), ns.output)


@dataclass(frozen=True)
class View:
    """One output of `collect`: its help line, the options it takes, and what prints it."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


VIEWS: dict[str, View] = {
    DEFAULT_VIEW: View(
        "(the default: `collect --input_dir DIR` is `collect tables --input_dir DIR`) selection and the result "
        "tables: test accuracy per dataset, averages, in-domain accuracy", _tables_arguments, _tables),
    "top-hparams": View(
        "per dataset, algorithm, test env and trial, the selected run, its hyperparameters and its validation "
        "and test accuracy", _top_hparams_arguments, _top_hparams),
    "trajectories": View(
        "per dataset and algorithm, the mean over runs of the record fields matching --fields at every "
        "checkpoint step", _trajectories_arguments, _trajectories),
    "draws": View(
        "per algorithm, every hparams draw with the hyperparameters that vary, training-domain validation and "
        "test accuracy per dataset and validation averaged over datasets, best first", _draws_arguments, _draws),
    "versus": View(
        "compare with another sweep launched with the same seeds and one setting changed: per algorithm both "
        "sweeps' cells and their difference paired by trial_seed, with the arguments their twin runs differ in",
        _versus_arguments, _versus),
    "masks-x-domains": View(
        "per dataset, algorithm and test env, the mask-by-domain matrices of `evaluate --masks_x_domains` "
        "(DMG's Table 4) of the runs training-domain validation selects, mean ± error over trials",
        _masks_x_domains_arguments, _masks_x_domains),
    "domain-masks": View(
        "per dataset, algorithm and test env, the weight masks of `diagnose --domain_masks` (Csordás et al.) in "
        "every run: kept weights and ratio per domain, IoU between domains per layer, seed stability, and the "
        "paper's numbers beside them", _domain_masks_arguments, _domain_masks),
    "mask-transfer": View(
        "the records of `domaingen mask-transfer` (Csordás et al.'s permuted-MNIST transfer), mean ± std over "
        "seed files: per task the share of its weights earlier tasks use, per layer; kept weights, accuracy and "
        "forgetting", _mask_transfer_arguments, _mask_transfer),
    "correlations": View(
        "per dataset and selection method, Spearman's rank correlation of record fields with the mean of "
        "--against fields, over the selected runs and over the algorithms' means", _correlations_arguments,
        _correlations),
    "ranks": View(
        "per selection method, the algorithms' ranks on each dataset and their average ranks, with Friedman's "
        "test and the Nemenyi critical difference (Demšar 2006)", _ranks_arguments, _ranks),
    "intervals": View(
        "per selection method and algorithm, the mean and the interquartile mean of test accuracy over all runs "
        "of all datasets, with stratified bootstrap intervals (rliable)", _intervals_arguments, _intervals),
    "verdict": View(
        "per published claim of a gain (a claims file), the method's defaults and grid points paired with the "
        "base by trial, the best point's gain with its 95%% interval, collapsed runs, and a verdict by a stated rule",
        _verdict_arguments, _verdict),
    "manifest": View(
        "each distinct code version, torch version and device of the done runs behind the tables (their "
        "manifest.json), with its number of runs", _manifest_arguments, _manifest),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `collect` command and one subcommand per view."""
    p = sub.add_parser("collect", help="selection + result tables from finished runs, or another view of them",
                       description="Without a view name, `collect` prints the tables: `domaingen collect "
                                   "--input_dir DIR ...` is `domaingen collect tables --input_dir DIR ...`. "
                                   "`domaingen collect VIEW --help` lists a view's options.")
    views = p.add_subparsers(title="views", dest="view", required=True, metavar="VIEW")
    for name, view in VIEWS.items():
        view.add_arguments(views.add_parser(name, help=view.help, description=view.help))


def with_view(argv: Sequence[str]) -> list[str]:
    """`argv` with the default view named after `collect` when none is: `collect --input_dir D`
    reads as `collect tables --input_dir D`. The command is argv's first word that is no option
    (the top-level options take no value)."""
    argv = list(argv)
    at = next((i for i, token in enumerate(argv) if not token.startswith("-")), None)
    if at is None or argv[at] != "collect":
        return argv
    following = argv[at + 1] if at + 1 < len(argv) else None
    if following in VIEWS or following in ("-h", "--help"):
        return argv
    return argv[:at + 1] + [DEFAULT_VIEW] + argv[at + 1:]


def run(ns: argparse.Namespace) -> int:
    """Print (or write) the view the command line names."""
    return VIEWS[ns.view].run(ns)
