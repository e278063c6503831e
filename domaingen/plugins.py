"""Plugins: modules outside the package that register algorithms, datasets, featurizers,
selection methods, launchers or test-time adapters.

A plugin is an ordinary Python module whose import registers names in the tables
(`ALGORITHMS`, `DATASETS`, `FEATURIZERS`, `tables.selection.SELECTION_METHODS`,
`sweep.launch.LAUNCHERS`, `adapt.ADAPTERS`). Plugins come from three places, loaded in
this order:

1. the entry-point group `domaingen.plugins` of every installed package
   (`[project.entry-points."domaingen.plugins"] name = "module"` in its pyproject.toml);
2. `$DOMAINGEN_PLUGINS`, comma-separated;
3. `--plugins` on the command line (or the `plugins` of a sweep spec, a run's
   args.json or a job), comma-separated.

Each is a module name importable from `sys.path` (the current directory is tried
last) or a path to a `.py` file (a package's `__init__.py` loads the package).
Loading is idempotent, and `loaded_plugins()` lists what this process loaded, in a
form another process can load again: the module name, or the file's absolute path
for a file found by path or only through the current directory. Runs and sweeps
record that list, so their jobs, resumptions, `evaluate` and `collect` load the same
plugins without the flag.

Selection methods and launchers. A selection method maps the records to one chosen
  checkpoint per run (`selection.scored_checkpoints` gives every checkpoint with its
  validation and test accuracy); `default=True` adds it to what `collect` shows without
  `--selection`, `pairs=True` says it validates on pair runs (see `SelectionMethod`). A
  launcher runs (or submits) a sweep's jobs and returns how each ended (see `Launcher`
  for the options it accepts). They become choices of `sweep launch --launcher` and
  `export --selection`, and `domaingen list` names them under the loaded plugins. A
  method that reads the held-out accuracy before the last checkpoint needs runs launched
  with `--eval_splits selection` (the default evaluates it there only at the end).

    from domaingen.sweep.launch import register_launcher
    from domaingen.sweep.workers import job_kwargs, run_job
    from domaingen.tables.selection import register_selection_method, scored_checkpoints

    @register_selection_method("first", "first checkpoint of each run", default=True)   # name, table caption
    def first_checkpoint(records):
        return scored_checkpoints(records).sort_values("step", kind="stable").drop_duplicates("run")

    @register_launcher("newest_first", "in this process, the last job first")   # name, --launcher help
    def launch_newest_first(jobs, sweep_dir, data_dir, options):
        return [run_job(job.job_id, job_kwargs(job, sweep_dir, data_dir, options.loggers), options.threads)
                for job in reversed(list(jobs))]

    domaingen --plugins my_methods sweep launch --spec s.toml --output_dir out --launcher newest_first --eval_splits selection
    domaingen --plugins my_methods collect --input_dir out    # training, oracle and first
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Iterable, Sequence

from domaingen.errors import DomaingenError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "domaingen.plugins"
ENV_VAR = "DOMAINGEN_PLUGINS"

# Plugins are imported modules, and imports are per process: this table mirrors
# sys.modules for the plugins, so that loading one twice is a no-op and a run can
# record what its process loaded. spec as given -> the spec to record.
_loaded: dict[str, str] = {}


class PluginError(DomaingenError):
    """A plugin that cannot be loaded; the message names it and what is wrong."""


def split_specs(values: Iterable[str] | str | None) -> list[str]:
    """Plugin specs from comma-separated strings (one, or several as `--plugins` repeated), blanks dropped."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [part.strip() for value in values for part in str(value).split(",") if part.strip()]


def is_path_spec(spec: str) -> bool:
    """True for a file path (`x.py`, or anything with a path separator), False for a module name."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _load_path(spec: str) -> tuple[ModuleType, str]:
    path = Path(spec).expanduser()
    if not path.is_file():
        raise PluginError(f"plugin {spec}: no such file ({path.resolve()} does not exist)")
    path = path.resolve()
    package = path.name == "__init__.py"
    name = path.parent.name if package else path.stem
    if not name.isidentifier():
        raise PluginError(f"plugin {spec}: '{name}' is not a valid module name; rename the file")
    existing = sys.modules.get(name)
    if existing is not None:
        where = getattr(existing, "__file__", None)
        if where and Path(where).resolve() == path:
            return existing, str(path)
        raise PluginError(f"plugin {spec}: another module named '{name}' is already loaded (from {where or 'built in'}); "
                          "rename the file")
    module_spec = importlib.util.spec_from_file_location(
        name, path, submodule_search_locations=[str(path.parent)] if package else None)
    if module_spec is None or module_spec.loader is None:
        raise PluginError(f"plugin {spec}: Python cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module, str(path)


def _missing_itself(exc: ModuleNotFoundError, spec: str) -> bool:
    """The import failed because `spec` (or a parent package of it) is not there, not a module it imports."""
    parts = spec.split(".")
    return exc.name in {".".join(parts[: i + 1]) for i in range(len(parts))}


def _load_name(spec: str) -> tuple[ModuleType, str]:
    if not all(part.isidentifier() for part in spec.split(".")):
        raise PluginError(f"plugin {spec}: not a module name (a.b.c) nor a path to a .py file")
    try:
        module = importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if not _missing_itself(exc, spec) or os.getcwd() in sys.path:
            raise
        # the `domaingen` console script does not put the current directory on sys.path; python -m does
        sys.path.append(os.getcwd())
        try:
            module = importlib.import_module(spec)
        finally:
            sys.path.remove(os.getcwd())
    return module, _portable_spec(spec, module)


def _portable_spec(spec: str, module: ModuleType) -> str:
    """A top-level module that lives in the current directory is recorded by its file, which a job
    started elsewhere (a Ray worker, another shell) can load; any other module by its name."""
    where = getattr(module, "__file__", None)
    if "." in spec or not where:
        return spec
    path = Path(where).resolve()
    folder = path.parent.parent if path.name == "__init__.py" else path.parent
    return str(path) if folder == Path.cwd().resolve() else spec


def load_plugin(spec: str) -> str:
    """Import one plugin (module name or .py path) unless already loaded; returns the spec to record.

    Raises PluginError with one line naming the plugin and the error: a missing module
    or file, an exception while importing it, or a name it registers that another
    module has registered already.
    """
    spec = spec.strip()
    if spec in _loaded:
        return _loaded[spec]
    try:
        module, recorded = _load_path(spec) if is_path_spec(spec) else _load_name(spec)
    except PluginError:
        raise
    except ModuleNotFoundError as exc:
        if _missing_itself(exc, spec):
            raise PluginError(f"plugin {spec}: no module named '{spec}' (not on sys.path, PYTHONPATH or in "
                              f"{os.getcwd()}); give its module name or the path to its .py file") from None
        raise PluginError(f"plugin {spec} failed to import: {_one_line(exc)}") from None
    except Exception as exc:  # its own code failed: a syntax error, a name clash, a missing dependency
        raise PluginError(f"plugin {spec} failed to import: {_one_line(exc)}") from None
    log.debug("loaded plugin %s (%s)", spec, getattr(module, "__file__", "?"))
    _loaded[spec] = recorded
    _loaded.setdefault(recorded, recorded)
    return recorded


# the entry points found, kept for the sys.path they were found on (see _entry_points)
_ENTRY_POINTS: dict[tuple[str, ...], list[metadata.EntryPoint]] = {}


def _entry_points() -> list[metadata.EntryPoint]:
    # Reading every installed distribution's metadata takes ~20 ms, and a sweep's worker asks
    # twice per job: the answer is kept while sys.path (where distributions are found) is the same.
    key = tuple(sys.path)
    if key not in _ENTRY_POINTS:
        seen: dict[str, metadata.EntryPoint] = {}
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            seen.setdefault(ep.value, ep)  # an editable install may list one entry point twice
        _ENTRY_POINTS.clear()
        _ENTRY_POINTS[key] = list(seen.values())
    return _ENTRY_POINTS[key]


def load_entry_points() -> list[str]:
    """Load every installed package's `domaingen.plugins` entry point; returns the recorded specs."""
    recorded = []
    for ep in _entry_points():
        module = ep.value.split(":", 1)[0].strip()
        if module in _loaded:
            recorded.append(_loaded[module])
            continue
        distribution = getattr(getattr(ep, "dist", None), "name", None) or "an installed package"
        try:
            recorded.append(load_plugin(module))
            if ":" in ep.value:  # module:attribute names an object in it; loading it checks that it exists
                ep.load()
        except PluginError as exc:
            raise PluginError(f"entry point '{ep.name}' of {distribution}: {exc}") from None
        except Exception as exc:
            raise PluginError(f"entry point '{ep.name}' of {distribution} ({ep.value}): {_one_line(exc)}") from None
    return recorded


def load_plugins(specs: Iterable[str] | str | None = None, *, environment: bool = True) -> list[str]:
    """Load the entry-point plugins, `$DOMAINGEN_PLUGINS` (unless `environment` is False) and `specs`.

    Idempotent; returns every plugin this process has loaded so far (`loaded_plugins()`).
    Raises PluginError (one line, naming the plugin) for the first that fails.
    """
    load_entry_points()
    wanted = split_specs(os.environ.get(ENV_VAR)) if environment else []
    for spec in wanted + split_specs(specs):
        load_plugin(spec)
    return loaded_plugins()


def loaded_plugins() -> list[str]:
    """The plugins this process loaded, as specs any process can load again, in load order, without repeats."""
    return list(dict.fromkeys(_loaded.values()))


def portable(spec: str) -> str:
    """The recorded form of a loaded plugin spec (see `load_plugin`); `spec` itself if it was not loaded."""
    return _loaded.get(spec.strip(), spec.strip())


def merge_specs(*lists: Sequence[str] | None) -> list[str]:
    """The plugin specs of several lists, in order, without repeats."""
    return list(dict.fromkeys(spec for specs in lists for spec in (specs or ())))


def forget(spec: str) -> None:
    """Forget that `spec` was loaded (tests; the module itself stays in sys.modules unless removed there)."""
    recorded = _loaded.pop(spec, None)
    for key in [k for k, v in _loaded.items() if v in (spec, recorded)]:
        del _loaded[key]


def recorded_plugins(path: str | os.PathLike) -> list[str]:
    """The plugins a run directory (args.json) or a sweep directory (sweep.json) names; [] if none."""
    import json

    found: list[str] = []
    for name in ("args.json", "sweep.json"):
        try:
            data = json.loads((Path(path) / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("plugins"), list):
            found += [str(spec) for spec in data["plugins"]]
    return merge_specs(found)
