"""Slurm submissions of a sweep: submitted in arrays, recorded in the sweep directory, queried later.

`sweep launch --launcher slurm` appends one line per job to `slurm_jobs.jsonl`
in the sweep directory (the sweep's job id, the scheduler's id, the cluster,
submitit's log folder). Any later process, `sweep status` or a relaunch, reads
it and asks the scheduler (through submitit) which of those jobs are still
queued or running, so that a relaunch submits only what is missing.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from domaingen.run.rundir import read_jsonl, to_json

log = logging.getLogger(__name__)

SUBMISSIONS_FILE = "slurm_jobs.jsonl"
# Slurm states of a job that will still run, or runs now (sacct's names; local jobs: RUNNING)
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "CONFIGURING", "SUSPENDED",
                           "RESV_DEL_HOLD"})
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"})
ACTIVE_STATES = QUEUED_STATES | RUNNING_STATES
DEFAULT_MAX_ARRAY = 1000  # Slurm's default MaxArraySize is 1001 (indices 0..1000)


@dataclass(frozen=True)
class Submission:
    """One job handed to the scheduler."""

    job_id: str  # the sweep's job id (its run directory)
    scheduler_id: str  # Slurm's id (ARRAY_INDEX), or the controller's pid on the local cluster
    cluster: str  # "slurm" or "local"
    folder: str  # submitit's log folder (with %j)
    submitted: str = ""


@dataclass(frozen=True)
class SubmitFailure:
    """A chunk of jobs the scheduler refused, and why."""

    job_ids: tuple[str, ...]
    reason: str


def record_submissions(sweep_dir: str | os.PathLike, submissions: Iterable[Submission]) -> None:
    """Append submissions to the sweep's record (O_APPEND: two launchers may append at once)."""
    lines = "".join(to_json(asdict(s)) + "\n" for s in submissions)
    if not lines:
        return
    with open(Path(sweep_dir) / SUBMISSIONS_FILE, "a") as f:
        f.write(lines)
        f.flush()
        os.fsync(f.fileno())


def read_submissions(sweep_dir: str | os.PathLike) -> dict[str, Submission]:
    """job_id -> its latest submission, from the sweep's record ({} when there is none)."""
    latest: dict[str, Submission] = {}
    fields = set(Submission.__dataclass_fields__)
    for row in read_jsonl(Path(sweep_dir) / SUBMISSIONS_FILE):
        if fields - {"submitted"} <= set(row):
            latest[row["job_id"]] = Submission(**{k: str(v) for k, v in row.items() if k in fields})
    return latest


def submit_arrays(
    executor: Any,
    function: Callable[..., Any],
    job_ids: Sequence[str],
    arguments: Sequence[tuple[Any, ...]],
    max_array: int = DEFAULT_MAX_ARRAY,
) -> tuple[list[tuple[str, Any]], list[SubmitFailure]]:
    """Submit `function(*arguments[i])` for each job, in arrays of at most `max_array`.

    A chunk the scheduler refuses (sbatch error, a limit) is reported with its
    reason and the next chunks are still submitted. Returns (job id, submitit
    job) pairs and the failures.
    """
    submitted: list[tuple[str, Any]] = []
    failures: list[SubmitFailure] = []
    for start in range(0, len(job_ids), max(1, max_array)):
        ids = list(job_ids[start:start + max_array])
        columns = list(zip(*arguments[start:start + max_array]))
        try:
            handles = executor.map_array(function, *columns)
        except Exception as exc:  # sbatch's refusal, whatever its form
            reason = " ".join(str(exc).split()) or type(exc).__name__
            failures.append(SubmitFailure(tuple(ids), f"{type(exc).__name__}: {reason}"))
            continue
        submitted.extend(zip(ids, handles))
    return submitted, failures


def as_submissions(pairs: Iterable[tuple[str, Any]], cluster: str, folder: str) -> list[Submission]:
    """Records for (job id, submitit job) pairs."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    return [Submission(job_id, str(handle.job_id), cluster, folder, now) for job_id, handle in pairs]


def _local_state(submission: Submission) -> str:
    # submitit's local jobs are processes; only the submitting process holds their handles,
    # so another process asks the kernel whether the controller lives
    try:
        cmdline = Path(f"/proc/{int(submission.scheduler_id)}/cmdline").read_bytes()
    except (OSError, ValueError):
        cmdline = b""
    if b"submitit" in cmdline:
        return "RUNNING"
    from submitit.core.utils import JobPaths

    paths = JobPaths(submission.folder, submission.scheduler_id)
    return "COMPLETED" if paths.result_pickle.exists() else "INTERRUPTED"


def _slurm_states(ids: Sequence[str]) -> dict[str, str]:
    from submitit.slurm.slurm import SlurmInfoWatcher

    watcher = SlurmInfoWatcher(delay_s=0)
    for scheduler_id in ids:
        watcher.register_job(scheduler_id)
    watcher.update()  # one sacct call for every array
    return {i: watcher.get_state(i, mode="cache").split()[0] for i in ids}


def scheduler_states(submissions: Mapping[str, Submission]) -> dict[str, str]:
    """job_id -> the scheduler's state of its latest submission (sacct's words, e.g. PENDING, RUNNING).

    UNKNOWN when the scheduler no longer knows the job (or sacct cannot be run);
    such a job counts as not queued, so a relaunch submits it again, and the run
    lock keeps a duplicate from running it twice at once.
    """
    states = {job: _local_state(s) for job, s in submissions.items() if s.cluster == "local"}
    slurm = {job: s.scheduler_id for job, s in submissions.items() if s.cluster != "local"}
    if slurm:
        by_id = _slurm_states(sorted(set(slurm.values())))
        states.update({job: by_id.get(sid, "UNKNOWN") for job, sid in slurm.items()})
    return states


def active_jobs(sweep_dir: str | os.PathLike, job_ids: Iterable[str]) -> dict[str, str]:
    """Those of `job_ids` whose latest submission is queued or running: job_id -> state."""
    wanted = set(job_ids)
    submissions = {j: s for j, s in read_submissions(sweep_dir).items() if j in wanted}
    if not submissions:
        return {}
    return {j: state for j, state in scheduler_states(submissions).items() if state in ACTIVE_STATES}


def describe(states: Mapping[str, str]) -> str:
    """'3 PENDING, 1 RUNNING' for a mapping of job -> state."""
    counts: dict[str, int] = {}
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))

