"""Live curves of a run: `--logger tensorboard` and `--logger wandb` (optional extras of the same names).

At every checkpoint, after its record is written, each logger gets the record's scalars
at that step: the update's losses under `loss/`, every evaluated accuracy (and WILDS
metric) under `accuracy/`, `step_time`, `eval_time`, `mem_gb` and `epoch` under `system/`, and every
other number the record holds (the algorithm's diagnostics: kept fractions, IoUs) under
`diagnostics/`.

- **tensorboard** writes event files into `RUN_DIR/tensorboard/` (`tensorboard --logdir
  SWEEP` shows every job of a sweep); a resumed run purges the steps after its checkpoint.
- **wandb** makes one W&B run per job, named after its directory, grouped by sweep (the
  sweep directory's name; `$WANDB_RUN_GROUP` overrides it), in project `$WANDB_PROJECT`
  (default `domaingen`), with the hyperparameters and the run's arguments as its config,
  and its files in `RUN_DIR/wandb/`. `$WANDB_MODE` decides online or offline; unset, the
  run goes offline when the W&B server cannot be reached (`wandb sync RUN_DIR/wandb/...`
  uploads it later). A resumed run continues the same W&B run.

Logging never changes a record and never fails a run: a logger that cannot start or that
raises warns once and is dropped, and the run goes on. An unknown name, or a logger whose
package is missing, stops `train` and `sweep launch` with one line before any run starts
(`check_loggers`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import math
import os
import re
import socket
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from domaingen.errors import DomaingenError

log = logging.getLogger(__name__)

# logger name -> (the module it imports, the extra that installs it)
LOGGERS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}
ACCURACY = re.compile(r"^(env\d+_(in|out)_acc(_\w+)?|wilds_.+)$")
SYSTEM = ("step_time", "eval_time", "mem_gb", "epoch")
NOT_SCALARS = {"step"}
WANDB_HOST = ("api.wandb.ai", 443)


class LoggerError(DomaingenError):
    """A logger that does not exist, or whose package is not installed."""


def check_logger_names(names: Iterable[str]) -> list[str]:
    """The names, each once, in order; raises LoggerError for one that is not a logger."""
    names = list(dict.fromkeys(names or ()))
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise LoggerError(f"unknown logger {', '.join(repr(n) for n in unknown)}; valid loggers: {', '.join(LOGGERS)}")
    return names


def check_loggers(names: Iterable[str]) -> list[str]:
    """check_logger_names, and that every logger's package is installed (the command that installs it if not)."""
    names = check_logger_names(names)
    for name in names:
        module, extra = LOGGERS[name]
        if importlib.util.find_spec(module) is None:
            raise LoggerError(f"--logger {name} needs the {module} package: pip install 'domaingen-bench[{extra}]' "
                              f"(or pip install {module})")
    return names


def scalars(record: Mapping[str, Any], losses: Iterable[str]) -> dict[str, float]:
    """The record's numbers at its step, keyed 'group/name' (loss, accuracy, system, diagnostics)."""
    losses = set(losses)
    out = {}
    for key, value in record.items():
        if key in NOT_SCALARS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value):
            continue
        group = ("loss" if key in losses else "accuracy" if ACCURACY.match(key) else "system" if key in SYSTEM
                 else "diagnostics")
        out[f"{group}/{key}"] = float(value)
    return out


class _TensorBoard:
    def __init__(self, run_dir: Path, start_step: int, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: events a crashed run wrote after its last checkpoint are dropped, as its records are
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step or None)
        if not start_step:
            self.writer.add_text("hparams", "\n".join(f"    {k}: {v!r}" for k, v in sorted(config["hparams"].items())))

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def wandb_mode(host: tuple[str, int] = WANDB_HOST, timeout: float = 2.0) -> str:
    """$WANDB_MODE, else online when the W&B server answers, else offline."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    try:
        socket.create_connection(host, timeout=timeout).close()
    except OSError:
        return "offline"
    return "online"


def _sweep_group(run_dir: Path) -> str | None:
    """The sweep a job belongs to: the name of the directory above it when that holds sweep.json."""
    parent = run_dir.resolve().parent
    return parent.name if (parent / "sweep.json").exists() else None


class _WandB:
    def __init__(self, run_dir: Path, start_step: int, config: Mapping[str, Any]) -> None:
        import wandb

        mode = wandb_mode()
        group = os.environ.get("WANDB_RUN_GROUP") or _sweep_group(run_dir)
        # the same W&B run across resumes: an id from the run's identity, directory name and group (no path)
        key = repr((sorted(config["identity"].items()), run_dir.name, group))
        run_id = hashlib.md5(key.encode()).hexdigest()[:16]
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "domaingen"),
            group=group,
            name=run_dir.name, id=run_id, resume="allow", dir=str(run_dir), mode=mode,
            config={"hparams": dict(config["hparams"]), "args": dict(config["args"])},
            reinit="create_new",
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True, save_code=False,
                                    init_timeout=30),
        )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self) -> None:
        self.run.finish()


OPENERS = {"tensorboard": _TensorBoard, "wandb": _WandB}


class RunLoggers:
    """The loggers of one run; each one that raises warns once and is dropped."""

    def __init__(self, names: Sequence[str], run_dir: str | os.PathLike, start_step: int,
                 hparams: Mapping[str, Any], args: Mapping[str, Any], identity: Mapping[str, Any]) -> None:
        self.active: dict[str, Any] = {}
        config = {"hparams": hparams, "args": args, "identity": identity}
        for name in names:
            try:
                self.active[name] = OPENERS[name](Path(run_dir), start_step, config)
            except Exception as exc:  # a logger never fails a run
                log.warning("logger %s could not start (%s: %s); the run goes on without it",
                            name, type(exc).__name__, exc)

    def log(self, record: Mapping[str, Any], losses: Iterable[str]) -> None:
        """Send one checkpoint's scalars (see `scalars`) to every logger."""
        if not self.active:
            return
        values = scalars(record, losses)
        for name, logger in list(self.active.items()):
            try:
                logger.log(int(record["step"]), values)
            except Exception as exc:
                self._drop(name, exc)

    def close(self) -> None:
        for name, logger in list(self.active.items()):
            try:
                logger.close()
            except Exception as exc:
                self._drop(name, exc)
        self.active = {}

    def _drop(self, name: str, exc: Exception) -> None:
        log.warning("logger %s failed (%s: %s); the run goes on without it", name, type(exc).__name__, exc)
        self.active.pop(name, None)
