"""`domaingen adapt` on the sweep launchers: one adaptation job per run, stored as in-process adaptation
stores it, resumable, printed by the dry launcher; Slurm through submitit's local executor, Ray on a local
instance, as the training launchers are tested."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from domaingen.adapt import adapt_run, adapted_file
from domaingen.adapt.jobs import ADAPT_RUNNER, AdaptJob
from domaingen.cli.main import main
from domaingen.sweep.workers import JOB_RUNNER, run_job
from test_adapt import train_run

RUNS = ("erm0", "erm1")
ADAPTERS = ("T3A", "TentClf")


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def numbers(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """Two done runs, nothing adapted."""
    root = tmp_path_factory.mktemp("trained")
    for seed, name in enumerate(RUNS):
        train_run(root / name, hparams_seed=seed)
    return root


@pytest.fixture(scope="module")
def in_process(trained, tmp_path_factory) -> dict[tuple[str, str], list[dict]]:
    """(run, adapter) -> the stored records of adapt_run called in this process."""
    root = tmp_path_factory.mktemp("in_process")
    shutil.copytree(trained, root, dirs_exist_ok=True)
    for run in RUNS:
        assert adapt_run(root / run, ADAPTERS) == {name: "done" for name in ADAPTERS}
    return {(run, name): numbers(adapted_file(root / run, name)) for run in RUNS for name in ADAPTERS}


def fresh(trained: Path, tmp_path: Path) -> Path:
    sweep = tmp_path / "sweep"
    shutil.copytree(trained, sweep)
    return sweep


def table(out: str) -> dict[tuple[str, str], int]:
    """(adapter, outcome) -> runs, from the command's table."""
    rows = {}
    for line in out.splitlines():
        words = line.split()
        if words and words[0] in ADAPTERS and words[-1].isdigit():
            rows[(words[0], " ".join(words[1:-1]))] = int(words[-1])
    return rows


def test_the_parallel_launcher_stores_what_in_process_adaptation_stores(trained, in_process, tmp_path, capsys):
    sweep = fresh(trained, tmp_path)
    code, out, _ = cli(capsys, "adapt", "--input_dir", str(sweep), "--adapters", *ADAPTERS, "--launcher", "parallel",
                       "--workers", "2", "--threads", "1", "--no_progress")
    assert code == 0 and "2 done runs: 0 adapted already with every adapter asked (skipped), 2 to adapt" in out
    assert table(out) == {("T3A", "done"): 2, ("TentClf", "done"): 2}
    for (run, name), records in in_process.items():
        assert numbers(adapted_file(sweep / run, name)) == records


def test_dry_prints_one_adapt_command_per_run_and_writes_nothing(trained, tmp_path, capsys):
    sweep = fresh(trained, tmp_path)
    code, out, _ = cli(capsys, "adapt", "--input_dir", str(sweep), "--adapters", "t3a", "--launcher", "dry",
                       "--data_dir", "embedded")
    commands = [line for line in out.splitlines() if line.startswith("domaingen ")]
    assert code == 0 and commands == [shlex.join(["domaingen", "adapt", "--input_dir", str(sweep / run),
                                                  "--adapters", "T3A", "--data_dir", "embedded"]) for run in RUNS]
    assert not list(sweep.glob("*/adapted_*"))
    code, again, _ = cli(capsys, "adapt", "--input_dir", str(sweep), "--dry")  # every adapter: no --adapters
    assert code == 0 and [line for line in again.splitlines() if line.startswith("domaingen ")] == [
        f"domaingen adapt --input_dir {sweep / run}" for run in RUNS]


def test_a_rerun_skips_the_stored_runs_and_redoes_what_an_interrupt_left(trained, in_process, tmp_path, capsys):
    sweep = fresh(trained, tmp_path)
    argv = ["adapt", "--input_dir", str(sweep), "--adapters", *ADAPTERS, "--launcher", "local"]
    assert cli(capsys, *argv)[0] == 0
    code, out, _ = cli(capsys, *argv)
    assert code == 0 and "2 done runs: 2 adapted already with every adapter asked (skipped), 0 to adapt" in out
    assert table(out) == {("T3A", "stored already"): 2, ("TentClf", "stored already"): 2}
    adapted_file(sweep / "erm1", "TentClf").unlink()  # interrupted while it adapted erm1 with TentClf
    kept = adapted_file(sweep / "erm1", "T3A").stat().st_mtime_ns
    code, out, _ = cli(capsys, *argv)
    assert code == 0 and "2 done runs: 1 adapted already with every adapter asked (skipped), 1 to adapt" in out
    assert table(out) == {("T3A", "stored already"): 2, ("TentClf", "stored already"): 1, ("TentClf", "done"): 1}
    assert adapted_file(sweep / "erm1", "T3A").stat().st_mtime_ns == kept
    assert numbers(adapted_file(sweep / "erm1", "TentClf")) == in_process[("erm1", "TentClf")]


def test_an_unknown_launcher_is_one_line_listing_the_valid_ones(trained, capsys):
    code, _, err = cli(capsys, "adapt", "--input_dir", str(trained), "--launcher", "nope")
    assert code == 2 and err.count("\n") == 1
    head, _, names = err.replace("'", "").partition(" (choose from ")
    assert head == "domaingen adapt: error: argument --launcher: invalid choice: nope"
    assert sorted(names.rstrip(")\n").split(", ")) == ["dry", "local", "parallel", "ray", "slurm"]


def test_workers_pick_the_launcher_and_zero_is_refused(trained, capsys):
    from domaingen.cli.adapt_commands import launcher_of
    from domaingen.cli.main import build_parser

    def chosen(*flags: str) -> str:
        return launcher_of(build_parser().parse_args(["adapt", "--input_dir", "x", *flags]))

    assert (chosen(), chosen("--workers", "3"), chosen("--workers", "3", "--launcher", "ray"),
            chosen("--dry")) == ("local", "parallel", "ray", "dry")
    code, _, err = cli(capsys, "adapt", "--input_dir", str(trained), "--workers", "0")
    assert code == 2 and err == "domaingen: error: --workers must be at least 1, got 0\n"


def test_a_job_payload_names_its_runner_and_a_bad_runner_fails_the_job_alone():
    job = AdaptJob.of_run("/s/run7", ["T3A"], "cpu")
    assert job.job_id == "adapt:run7"
    assert job.payload("/s", None) == {JOB_RUNNER: ADAPT_RUNNER, "run_dir": "/s/run7", "adapters": ["T3A"],
                                       "data_dir": None, "device": "cpu"}
    result = run_job("x", {JOB_RUNNER: "domaingen.adapt.jobs:no_such_runner"})
    assert (result.job_id, result.state) == ("x", "failed") and result.message.startswith("AttributeError: ")


def test_slurm_through_submitits_local_executor(trained, in_process, tmp_path, capsys):
    pytest.importorskip("submitit")
    sweep = fresh(trained, tmp_path)
    code, out, _ = cli(capsys, "adapt", "--input_dir", str(sweep), "--adapters", "T3A", "--launcher", "slurm",
                       "--slurm_cluster", "local", "--slurm_cpus", "1", "--jobs_per_task", "2", "--no_progress")
    assert code == 0 and table(out) == {("T3A", "done"): 2}
    for run in RUNS:
        assert numbers(adapted_file(sweep / run, "T3A")) == in_process[(run, "T3A")]
    recorded = [json.loads(line)["job_id"] for line in (sweep / "slurm_jobs.jsonl").read_text().splitlines()]
    assert recorded == [f"adapt:{run}" for run in RUNS]  # never a training job's id


def test_ray_on_a_local_instance(trained, in_process, tmp_path, capsys):
    ray = pytest.importorskip("ray")
    sweep = fresh(trained, tmp_path)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
    try:
        code, out, _ = cli(capsys, "adapt", "--input_dir", str(sweep), "--adapters", "T3A", "--launcher", "ray",
                           "--no_progress")
    finally:
        ray.shutdown()
    assert code == 0 and table(out) == {("T3A", "done"): 2}
    for run in RUNS:
        assert numbers(adapted_file(sweep / run, "T3A")) == in_process[(run, "T3A")]
