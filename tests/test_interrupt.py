"""Interrupting a parallel sweep (Ctrl-C, or SIGTERM to the launcher) stops it whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST_HPARAMS
from domaingen.cli import main
from domaingen.run.rundir import RunDirectory

N_JOBS = 6  # ColoredMNIST's 3 test environments x 2 trials


def _started_runs(sweep_dir: Path) -> list[Path]:
    return sorted(p.parent for p in sweep_dir.glob("*/args.json"))


def _records(run: Path) -> int:
    return len(RunDirectory(run).records())


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("launcher_name, how", [
    ("parallel", "SIGTERM to the launcher"),
    ("parallel", "Ctrl-C (SIGINT to the process group)"),
    ("local", "SIGTERM to the launcher"),
])
def test_an_interrupted_sweep_stops_every_job(tmp_path, mnist_dir, capsys, launcher_name, how):
    sweep_dir = tmp_path / "sweep"
    workers = 2 if launcher_name == "parallel" else 1
    command = [
        sys.executable, "-m", "domaingen", "sweep", "launch", "--algorithms", "ERM", "--datasets", "ColoredMNIST",
        "--n_hparams", "1", "--n_trials", "2", "--steps", "1000000", "--checkpoint_freq", "50",
        "--hparams", json.dumps(FAST_HPARAMS), "--output_dir", str(sweep_dir), "--data_dir", str(mnist_dir),
        "--launcher", launcher_name, "--workers", str(workers), "--threads", "1", "--yes", "--no_progress",
    ]
    launcher = subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        _wait_for(lambda: len(_started_runs(sweep_dir)) == workers
                  and all(_records(r) >= 2 for r in _started_runs(sweep_dir)),
                  timeout=180, what="every worker's run to record two checkpoints")
        if how.startswith("SIGTERM"):
            launcher.send_signal(signal.SIGTERM)
        else:
            os.killpg(launcher.pid, signal.SIGINT)
        _, stderr = launcher.communicate(timeout=120)
        assert launcher.returncode == 130, stderr
        assert "domaingen: interrupted" in stderr and "Traceback" not in stderr, stderr
        # no process of the sweep outlives it (workers, and the resource tracker shortly after)
        _wait_for(lambda: not _group_alive(launcher.pid), timeout=15, what="the sweep's processes to exit")
    finally:  # whatever failed, leave no process of the sweep behind
        if _group_alive(launcher.pid):
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    runs = _started_runs(sweep_dir)
    assert len(runs) == workers, "a worker took another job after the interrupt"
    counts = {run: _records(run) for run in runs}
    time.sleep(1.0)
    assert {run: _records(run) for run in runs} == counts  # nothing trains on
    for run in runs:
        log = (run / "log.txt").read_text()
        assert "interrupted; rerun the same command to resume from the last checkpoint" in log
        assert RunDirectory(run).load_checkpoint() is not None  # what a relaunch resumes from
    capsys.readouterr()
    assert main(["sweep", "status", "--output_dir", str(sweep_dir)]) == 0
    status = capsys.readouterr().out
    assert f"{N_JOBS} jobs in {sweep_dir}: 0 done, {workers} incomplete, 0 failed, {N_JOBS - workers} not launched" in status


class _GoneWorker:
    """A worker the launcher still lists as alive although its process has been reaped:
    what it sees when the pool's own thread reaps a worker between the check and the signal."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.killed = False

    def join(self, timeout: float | None = None) -> None:
        pass

    def is_alive(self) -> bool:
        return not self.killed

    def kill(self) -> None:
        self.killed = True


class _PoolOfGoneWorkers:
    def __init__(self, workers: list[_GoneWorker]) -> None:
        self._processes = {w.pid: w for w in workers}
        self.shut_down = False

    def shutdown(self, wait: bool = True) -> None:
        self.shut_down = True


def test_stopping_a_worker_that_is_already_gone_is_not_an_error(monkeypatch):
    from domaingen.sweep import parallel as launchers
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()  # reaped: its pid now names no process
    worker = _GoneWorker(finished.pid)
    pool = _PoolOfGoneWorkers([worker])
    monkeypatch.setattr(launchers, "INTERRUPT_GRACE_S", 0.0)
    monkeypatch.setattr(launchers, "STOP_TIMEOUT_S", 0.0)
    launchers._stop_workers(pool)  # the CI failure: ProcessLookupError from os.kill
    assert worker.killed and pool.shut_down


@pytest.mark.parametrize("exit_status, raised", [(130, KeyboardInterrupt), (3, "BrokenProcessPool")])
def test_a_pool_broken_by_interrupted_workers_is_an_interrupt(exit_status, raised):
    """A Ctrl-C that the launcher sees only as its workers' deaths (the kernel gave the launcher's
    copy of the signal to the pool's thread) still ends the sweep as interrupted; a worker that
    died of anything else still breaks the pool as it did."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from domaingen.sweep import parallel as launchers
    from domaingen.sweep.workers import LaunchOptions

    expected = BrokenProcessPool if raised == "BrokenProcessPool" else raised
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(os._exit, exit_status) for _ in range(3)]
        with pytest.raises(expected):
            launchers._collect_results(pool, futures, LaunchOptions(progress=False))


class _LateReapedWorker:
    """A dead worker whose exit code shows only after a few reads: the pool's own thread reaped it
    first, so this thread's waitpid found no child and read None until that thread recorded it."""

    def __init__(self, exitcode: int, hidden_reads: int) -> None:
        self._exitcode, self._hidden = exitcode, hidden_reads

    def join(self, timeout: float | None = None) -> None:
        pass

    @property
    def exitcode(self) -> int | None:
        if self._hidden:
            self._hidden -= 1
            return None
        return self._exitcode


def test_an_interrupted_worker_reaped_by_the_pool_thread_still_counts_as_interrupted(monkeypatch):
    from domaingen.sweep import parallel as launchers

    monkeypatch.setattr(launchers, "EXIT_CODE_POLL_S", 0.0)
    assert launchers._interrupted([_LateReapedWorker(launchers.INTERRUPTED_EXIT, hidden_reads=5),
                                   _LateReapedWorker(-15, hidden_reads=0)])
    # a worker that died of something else is not an interrupt, however late its code shows
    assert not launchers._interrupted([_LateReapedWorker(1, hidden_reads=5), _LateReapedWorker(-15, hidden_reads=0)])


def _sleep_then_mark(path: str, seconds: float) -> None:
    time.sleep(seconds)
    Path(path).write_text("finished")


def test_a_signal_handed_to_another_launcher_thread_still_stops_the_sweep(tmp_path):
    """A SIGINT (or the CLI's SIGTERM) that the kernel delivers to one of the launcher's other threads
    must interrupt the sweep while its jobs run, not once the next job has finished: here the only job
    would finish (and write its mark) after 20 s, and the interrupt must stop it before."""
    import multiprocessing
    import threading
    from concurrent.futures import ProcessPoolExecutor

    from domaingen.sweep import parallel as launchers
    from domaingen.sweep.workers import LaunchOptions

    mark = tmp_path / "finished"

    def interrupt_from_this_thread() -> None:
        time.sleep(1.0)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    # Python's own SIGINT handler, as a launcher has it (a test before this one may have left another)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_sleep_then_mark, str(mark), 20.0)]
            threading.Thread(target=interrupt_from_this_thread, daemon=True).start()
            with pytest.raises(KeyboardInterrupt):
                launchers._collect_results(pool, futures, LaunchOptions(progress=False))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not mark.exists()


def test_completed_yields_every_future_once_as_it_finishes():
    from concurrent.futures import ThreadPoolExecutor

    from domaingen.sweep import parallel as launchers

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(time.sleep, s) for s in (0.3, 0.0, 0.1)]
        finished = list(launchers._completed(futures, poll_s=0.05))
    assert sorted(map(id, finished)) == sorted(map(id, futures))
    assert finished[-1] is futures[0]
