"""The `domaingen` command: train, list, sweep, collect, download, adapt, evaluate, diagnose, report, mask-transfer."""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import signal
import sys
import threading
from typing import Iterator, NoReturn, Sequence

from tabulate import tabulate

from domaingen.cli import adapt_commands as adapt_cli
from domaingen.cli import collect_commands as collect_cli
from domaingen.cli import domainbed_flags
from domaingen.cli import inspect_commands as inspect_cli
from domaingen.cli import spec_commands as spec_cli
from domaingen.cli import transfer_commands as transfer_cli
from domaingen.errors import DomaingenError

log = logging.getLogger("domaingen")


def _add_train_parser(sub: argparse._SubParsersAction) -> None:
    from domaingen.run.settings import add_flag
    from domaingen.run.training import SETTINGS

    p = sub.add_parser("train", help="train one run (resumes an incomplete one, skips a done one)")
    for item in SETTINGS:
        if item.info.train:
            add_flag(p, item)


class CommandParser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), for every subcommand too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _chosen_parser(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser:
    """The deepest subcommand's parser that `ns` went through (`sweep launch` -> its parser)."""
    for dest in ("command", "action", "view"):
        name = getattr(ns, dest, None)
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction) and a.dest == dest]
        if name is None or not subparsers or name not in subparsers[0].choices:
            continue
        parser = subparsers[0].choices[name]
    return parser


def parse_command_line(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """`parser.parse_args(argv)`, where an unknown flag is refused in one line naming the closest valid one."""
    from domaingen.run.settings import closest

    ns, extras = parser.parse_known_args(argv)
    if extras:
        chosen = _chosen_parser(parser, ns)
        flags = [o for action in chosen._actions for o in action.option_strings if o.startswith("--") and o != "--help"]
        unknown = extras[0]
        hint = closest(unknown.split("=")[0], flags) if unknown.startswith("-") else ""
        what = "unknown flag" if unknown.startswith("-") else "unexpected argument"
        chosen.error(f"{what} {unknown}{hint}")
    return ns


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="domaingen", description="Domain-generalization benchmark suite")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    parser.add_argument("--plugins", metavar="MODULE[,MODULE...]", action="append", default=[],
                        help="modules that register algorithms, datasets, featurizers, selection methods or launchers, "
                             "loaded before anything else (module names or .py paths; also $DOMAINGEN_PLUGINS and "
                             "installed packages' "
                             "'domaingen.plugins' entry points); may stand anywhere on the command line")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train_parser(sub)
    sub.add_parser("list", help="the algorithm and dataset tables")
    _add_sweep_parser(sub)
    _add_collect_parser(sub)
    _add_export_parser(sub)
    _add_check_results_parser(sub)
    _add_download_parser(sub)
    adapt_cli.add_parser(sub)
    inspect_cli.add_parsers(sub)
    transfer_cli.add_parser(sub)
    spec_cli.add_parser(sub)
    return parser


def _add_download_parser(sub: argparse._SubParsersAction) -> None:
    from domaingen.datasets.download import DATASETS as DOWNLOADABLE

    p = sub.add_parser("download", help="fetch a dataset from its sources (the original first, then mirrors) "
                                        "into --data_dir; --list shows every dataset's sources and state")
    p.add_argument("--dataset", default=None, metavar="NAME", help=f"one of {', '.join(DOWNLOADABLE)} (any case)")
    p.add_argument("--list", dest="list_sources", action="store_true",
                   help="list each dataset's sources, size, licence and whether it is present and verified in --data_dir")
    p.add_argument("--data_dir", default=None, help="default: $DOMAINGEN_DATA, else ./data")


def _add_sweep_parser(sub: argparse._SubParsersAction) -> None:
    from domaingen.cli.launch_flags import add_launch_flags
    from domaingen.run.settings import add_flag
    from domaingen.run.training import LAUNCH_SETTINGS, SETTINGS
    from domaingen.sweep.spec import FLAG_SETTINGS

    SETTING = {item.name: item for item in SETTINGS}
    p = sub.add_parser("sweep", help="launch, inspect or clean a sweep")
    actions = p.add_subparsers(dest="action", required=True)
    for name, text in (
        ("launch", "run every job not done yet (resumes incomplete ones)"),
        ("status", "count jobs per state, algorithm and dataset"),
        ("delete-incomplete", "remove the directories of incomplete and failed jobs"),
    ):
        a = actions.add_parser(name, help=text)
        a.add_argument("--spec", help="TOML sweep spec (flags below override its keys)")
        a.add_argument("--parts", nargs="+", type=int, metavar="N",
                       help="only these [[parts]] of the spec (1-based, in the file's order), as a sweep of "
                            "their own: its output_dir records only them")
        a.add_argument("--output_dir", required=True)
        a.add_argument("--data_dir", default=None, help=SETTING["data_dir"].info.help)
        for item in FLAG_SETTINGS:
            add_flag(a, item, for_sweep=True, help=f"{item.info.help} (default: the spec's)")
        if name == "launch":
            add_launch_flags(a, "parallel", 2)
            a.add_argument("--order", choices=["spec", "trial"], default="spec",
                           help="spec: the spec's order (part, dataset, algorithm, ...); trial: every job of "
                                "trial 0 first, then trial 1, ... (stop a long sweep early and every "
                                "algorithm has the same finished trials to compare)")
            a.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
            a.add_argument("--force", action="store_true", help="launch a different spec into this output_dir")
            a.add_argument("--retry_failed", action="store_true", help="also rerun failed jobs")
            for item in LAUNCH_SETTINGS:
                add_flag(a, item, for_sweep=True, help=f"every job: {item.info.help}")
        if name == "delete-incomplete":
            a.add_argument("--yes", "-y", action="store_true")
        if name == "status":
            a.add_argument("--watch", action="store_true",
                           help="one screen refreshed every --interval seconds: job counts, the running jobs' latest "
                                "step and validation accuracy, and an ETA, until the sweep ends or Ctrl-C")
            a.add_argument("--interval", type=float, default=5.0, help="--watch: seconds between refreshes")
    a = actions.add_parser("restore", help="write an exported bundle's done runs and spec into a sweep directory, so "
                                           "that sweep launch continues the sweep where the bundle left it")
    a.add_argument("--bundle", required=True, metavar="FILE.zip",
                   help="a bundle domaingen export wrote (with --all_runs: every done run), or its unpacked folder")
    a.add_argument("--output_dir", required=True, help="the sweep directory (new, or holding the same sweep)")


def _add_export_parser(sub: argparse._SubParsersAction) -> None:
    from domaingen.tables.selection import selection_method_names, selection_methods_help

    p = sub.add_parser("export", help="a zip of the runs a sweep's tables selected: args, manifests, records, logs, "
                                      "weights, the tables and how to reload them")
    p.add_argument("--input_dir", required=True, help="the sweep directory")
    p.add_argument("--output", required=True, metavar="FILE.zip")
    p.add_argument("--selection", nargs="+", choices=selection_method_names(), default=None,
                   help="the methods whose selected runs to bundle, as for collect; " + selection_methods_help())
    p.add_argument("--hparams_choice", default="per_trial", help="as for collect")
    p.add_argument("--no_weights", action="store_true", help="leave the .pt files out (records only)")
    p.add_argument("--records", choices=["solid", "files"], default="solid",
                   help="solid (default): every file but the weights compressed together into records.tar.xz, "
                        "about half the size; files: each file its own zip member")
    p.add_argument("--datasets", nargs="+", metavar="DATASET", help="only these datasets' runs")
    p.add_argument("--allow_mixed_sources", action="store_true", help="as for collect")
    p.add_argument("--backs", nargs="+", default=[], metavar="PATH",
                   help="the files under results/ this bundle's records back (recorded in bundle.json; "
                        "domaingen check-results refuses a bundle named for another file)")
    p.add_argument("--all_runs", action="store_true",
                   help="bundle every done run's records, not only those the tables selected (with --no_weights: "
                        "the records behind every view of collect)")


def _add_check_results_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-results", help="rerun every command of results/regenerate.tsv and compare its output "
                                             "with the committed file (reads records, never trains)")
    p.add_argument("--root", default=".", help="the repository root (default: the current directory)")
    p.add_argument("--only", nargs="+", default=[], metavar="PATH", help="check only these files")
    p.add_argument("--jobs", type=int, default=1, help="commands run at once (default 1)")
    p.add_argument("--write", action="store_true",
                   help="rewrite each file that differs with what its command prints (after a change of format)")


def _add_collect_parser(sub: argparse._SubParsersAction) -> None:
    collect_cli.add_parser(sub)


def cmd_train(ns: argparse.Namespace) -> int:
    from domaingen.plugins import load_plugins, recorded_plugins
    from domaingen.run.loggers import check_loggers
    from domaingen.run.rundir import INCOMPLETE
    from domaingen.run.settings import flag_values
    from domaingen.run.training import REQUEUE_EXIT_STATUS, SETTINGS, TrainConfig, train

    values = flag_values(SETTINGS, ns)
    values["loggers"] = check_loggers(values["loggers"])
    values["plugins"] = ns.plugins
    load_plugins(recorded_plugins(ns.output_dir))  # resuming a run: the plugins it was started with
    outcome = train(TrainConfig(**values))
    print(outcome.message)
    return REQUEUE_EXIT_STATUS if outcome.state == INCOMPLETE else 0


def cmd_list(ns: argparse.Namespace) -> int:
    from domaingen.algorithms import ALGORITHMS
    from domaingen.datasets import DATASETS

    rows = []
    for name in DATASETS:
        cls = DATASETS.get(name)
        envs = ", ".join(f"{i}:{e}" for i, e in enumerate(cls.ENVIRONMENTS))
        rows.append([name, envs, "x".join(map(str, cls.INPUT_SHAPE)), cls.NUM_CLASSES, cls.N_STEPS, cls.CHECKPOINT_FREQ])
    print("Datasets\n")
    print(tabulate(rows, headers=["dataset", "environments", "input", "classes", "steps", "checkpoint"]))
    print("\nDataset hyperparameters (default; random-search distribution)\n")
    hp_rows = [
        [name, hp_name, hp.describe()] for name in DATASETS for hp_name, hp in DATASETS.get(name).hparam_space().items()
    ]
    print(tabulate(hp_rows, headers=["dataset", "hparam", "default; distribution"]))
    print("\nAlgorithms (default; random-search distribution)\n")
    algo_rows = []
    for name in ALGORITHMS:
        cls = ALGORITHMS.get(name)
        space = cls.hparam_space()
        summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        if not space:
            algo_rows.append([name, "-", "", summary])
        for i, (hp_name, hp) in enumerate(space.items()):
            algo_rows.append([name if i == 0 else "", hp_name, hp.describe(), summary if i == 0 else ""])
    print(tabulate(algo_rows, headers=["algorithm", "hparam", "default; distribution", "what it does"]))
    composed = ALGORITHMS.composed_names()
    for modifier in sorted({name.rpartition("+")[2] for name in composed}):
        example = next(name for name in composed if name.endswith(f"+{modifier}"))
        base_space = ALGORITHMS.get(example.rpartition("+")[0]).hparam_space()
        extra = {k: v for k, v in ALGORITHMS.get(example).hparam_space().items() if k not in base_space}
        print(f"\nCompositions: X+{modifier} for every algorithm X above, with X's hyperparameters and these\n")
        print(tabulate([[k, v.describe(), v.help] for k, v in extra.items()], headers=["hparam", "default; distribution", ""]))
    _print_plugins()
    return 0


def _print_plugins() -> None:
    """The names each loaded plugin registered (nothing when no plugin is loaded)."""
    from domaingen.adapt import ADAPTERS
    from domaingen.algorithms import ALGORITHMS
    from domaingen.datasets import DATASETS
    from domaingen.networks import FEATURIZERS
    from domaingen.plugins import loaded_plugins
    from domaingen.sweep.launch import LAUNCHERS
    from domaingen.inspect.combiners import COMBINERS
    from domaingen.tables.selection import SELECTION_METHODS

    plugins = loaded_plugins()
    if not plugins:
        return
    rows = []
    for table in (ALGORITHMS, DATASETS, FEATURIZERS, SELECTION_METHODS, LAUNCHERS, ADAPTERS, COMBINERS):
        for name, module in table.owners().items():
            if not module.endswith("(built in)"):
                rows.append([module, table.kind, name])
    print(f"\nPlugins loaded: {', '.join(plugins)}\n")
    print(tabulate(rows, headers=["module", "kind", "name"]))


def cmd_sweep(ns: argparse.Namespace) -> int:
    from domaingen.cli import sweep_commands as sweep_cli
    return sweep_cli.run(ns)


def cmd_collect(ns: argparse.Namespace) -> int:
    return collect_cli.run(ns)


def cmd_export(ns: argparse.Namespace) -> int:
    from domaingen.cli import sweep_commands as sweep_cli
    return sweep_cli.export_command(ns)


def cmd_check_results(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from domaingen.tables.regenerate import check_results, read_entries, summary

    root = Path(ns.root)
    checked = len(ns.only) if ns.only else len(read_entries(root))
    problems = check_results(root, ns.only, ns.jobs, write=ns.write)
    print(summary(problems, checked))
    return 1 if problems else 0


def cmd_download(ns: argparse.Namespace) -> int:
    from domaingen.cli.paths import check_output_dir
    from domaingen.datasets import resolve_data_dir
    from domaingen.datasets.download import download, format_listing, listing

    data_dir = resolve_data_dir(ns.data_dir)
    if ns.list_sources:
        print(format_listing(listing(data_dir), data_dir))
        return 0
    if ns.dataset is None:
        raise DomaingenError("give --dataset NAME to download, or --list to see the datasets and their sources")
    check_output_dir(data_dir, "--data_dir")  # also when it comes from $DOMAINGEN_DATA or the default
    print(download(ns.dataset, data_dir))
    return 0


COMMANDS = {"train": cmd_train, "list": cmd_list, "sweep": cmd_sweep, "collect": cmd_collect, "export": cmd_export,
            "check-results": cmd_check_results, "download": cmd_download, "adapt": adapt_cli.run}
COMMANDS.update(inspect_cli.COMMANDS)
COMMANDS["spec"] = spec_cli.run
COMMANDS["mask-transfer"] = transfer_cli.run

# the paths each command writes to (or, for status and delete-incomplete, reads a sweep from),
# checked before it starts: (command, or "sweep ACTION"), attribute, flag, kind
OUTPUT_PATHS = (
    ("train", "output_dir", "--output_dir", "dir"),
    ("sweep launch", "output_dir", "--output_dir", "dir"),
    ("sweep status", "output_dir", "--output_dir", "sweep"),
    ("sweep delete-incomplete", "output_dir", "--output_dir", "sweep"),
    ("sweep restore", "output_dir", "--output_dir", "dir"),
    ("collect", "output", "--output", "file"),
    ("export", "output", "--output", "file"),
    ("report", "output", "--output", "dir"),
    ("diagnose", "output", "--output", "file"),
    ("mask-transfer", "output", "--output", "file"),
    ("download", "data_dir", "--data_dir", "dir"),
)
# what an OSError the checks could not foresee (a disk filling up, a path changed meanwhile) means to a user
PATH_ERRNOS = {errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EROFS, errno.ENOSPC,
               errno.ENOENT, errno.EDQUOT}


def check_paths(ns: argparse.Namespace) -> None:
    """Refuse, in one line, an output path that is a file where a directory goes (or the reverse), lies under
    a file, or cannot be written; before the command does any work."""
    from domaingen.cli.paths import check_output_dir, check_output_file, check_sweep_dir

    checks = {"dir": check_output_dir, "file": check_output_file, "sweep": check_sweep_dir}
    command = ns.command if ns.command != "sweep" else f"sweep {ns.action}"
    for name, attribute, flag, kind in OUTPUT_PATHS:
        value = getattr(ns, attribute, None)
        if name == command and value is not None and not getattr(ns, "list_sources", False):  # --list only reads
            checks[kind](value, flag)


def preparse_plugins(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(plugin specs of every --plugins, the other arguments): --plugins may stand anywhere, and is
    read before the subcommand's arguments, whose names (algorithms, datasets) plugins register."""
    from domaingen.plugins import split_specs

    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--plugins", action="append", default=[])
    known, rest = pre.parse_known_args(list(argv))
    return split_specs(known.plugins), rest


def protect_environment_names(argv: Sequence[str]) -> list[str]:
    """argv with a space before each value of --test_envs that starts like a negative number
    ("-90%"): argparse would read it as an option; run.settings.environment_token strips the space."""
    out, in_test_envs = [], False
    for token in argv:
        if in_test_envs and len(token) > 1 and token[0] == "-" and (token[1].isdigit() or token[1] == "."):
            token = " " + token
        elif token.startswith("-"):
            in_test_envs = token == "--test_envs"
        out.append(token)
    return out


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block a SIGTERM (kill, a scheduler, a timeout) stops the command as Ctrl-C
    does: a run logs the interrupt and keeps its last checkpoint, and a sweep launcher
    stops its workers instead of leaving them running. Restores the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `domaingen` console command; returns the exit status."""
    from domaingen.plugins import load_plugins

    argv = list(sys.argv[1:] if argv is None else argv)
    specs, argv = preparse_plugins(argv) if "--plugins" in " ".join(argv) else ([], argv)
    try:
        load_plugins(specs)
        argv = domainbed_flags.translate(argv)
    except DomaingenError as exc:
        print(f"domaingen: error: {exc}", file=sys.stderr)
        return 2
    try:
        ns = parse_command_line(build_parser(), protect_environment_names(collect_cli.with_view(argv)))
    except SystemExit as exc:  # --help, or a bad flag argparse has already described
        return int(exc.code or 0)
    ns.plugins = specs
    logging.basicConfig(
        level=logging.WARNING if ns.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    try:
        with sigterm_interrupts():
            check_paths(ns)
            return COMMANDS[ns.command](ns)
    except DomaingenError as exc:
        print(f"domaingen: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("domaingen: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `domaingen sweep launch --dry | head`
        sys.stderr.close()
        return 0
    except OSError as exc:
        if exc.errno not in PATH_ERRNOS or exc.filename is None:
            raise
        print(f"domaingen: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
