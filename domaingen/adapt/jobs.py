"""The adaptation job: "adapt run R with adapters A", a job every sweep launcher runs.

An `AdaptJob` has what the launchers ask of a job (`job_id`, `payload`, `command`);
its payload names `run_adaptation` as its JOB_RUNNER, so a local, parallel, Slurm or
Ray worker calls it in place of training. The job writes each adapter's results
beside its run as `adapt_run` does (`adapted_{ADAPTER}.jsonl`, one file written whole
per adapter), so a job interrupted or requeued redoes only the adapters it had not
stored.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from domaingen.adapt.run import adapt_run
from domaingen.errors import DomaingenError
from domaingen.sweep.workers import JOB_RUNNER, JobResult

ADAPT_RUNNER = "domaingen.adapt.jobs:run_adaptation"
JOB_PREFIX = "adapt:"  # an adaptation job's id is this and its run's name, never a training job's id
REFUSED = "refused"  # the job's state when the run cannot be adapted as asked (a DomaingenError: one line)


@dataclass(frozen=True)
class AdaptJob:
    """Adapt the run `run_dir` with `adapters` (None: every adapter defined for it) on `device`."""

    job_id: str
    run_dir: str
    adapters: tuple[str, ...] | None = None
    device: str = "auto"

    @classmethod
    def of_run(cls, run_dir: str | Path, adapters: Sequence[str] | None, device: str = "auto") -> "AdaptJob":
        return cls(JOB_PREFIX + Path(run_dir).name, str(run_dir), None if adapters is None else tuple(adapters),
                   device)

    def payload(self, sweep_dir: str, data_dir: str | None, loggers: Sequence[str] = ()) -> dict[str, Any]:
        """What the worker receives: the run, the adapters, the data directory and the device."""
        return {JOB_RUNNER: ADAPT_RUNNER, "run_dir": self.run_dir,
                "adapters": None if self.adapters is None else list(self.adapters), "data_dir": data_dir,
                "device": self.device}

    def command(self, sweep_dir: str, data_dir: str | None, loggers: Sequence[str] = ()) -> str:
        """The `domaingen adapt` command line that runs this job."""
        parts = ["domaingen", "adapt", "--input_dir", self.run_dir]
        parts += ["--adapters", *self.adapters] if self.adapters is not None else []
        parts += ["--data_dir", data_dir] if data_dir else []
        parts += ["--device", self.device] if self.device != "auto" else []
        return shlex.join(parts)


def run_adaptation(job_id: str, payload: Mapping[str, Any], cache: Any = None) -> JobResult:
    """An adaptation job's body in a worker: adapt_run, its outcome per adapter in `details`. A run that
    cannot be adapted as asked ends REFUSED with the one-line reason; other errors reach run_job."""
    adapters = payload.get("adapters")
    try:
        outcome = adapt_run(payload["run_dir"], adapters, data_dir=payload.get("data_dir"),
                            device=payload.get("device", "auto"), skip_undefined=adapters is None)
    except DomaingenError as exc:
        return JobResult(job_id, REFUSED, str(exc))
    adapted = sum(what == "done" for what in outcome.values())
    return JobResult(job_id, "done", f"{adapted} adapters adapted, {len(outcome) - adapted} not", dict(outcome))
