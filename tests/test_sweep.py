"""Sweeps end to end: job lists, launch/resume, collect, bad specs."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import FAST_HPARAMS
from domaingen.cli.main import main
from domaingen.sweep.workers import threads_per_worker
from domaingen.sweep.spec import build_jobs, job_id, job_states, parse_spec

SPEC = """
algorithms = ["ERM", "VREx"]
datasets = ["ColoredMNIST"]
n_hparams = 1
n_trials = 2
steps = {steps}
checkpoint_freq = {freq}

[hparams]
featurizer = "MLP"
mlp_width = 32
batch_size = 16
"""


def write_spec(tmp_path: Path, steps: int = 6, freq: int = 2, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(SPEC.format(steps=steps, freq=freq))
    return path


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def launch_args(spec: Path, out: Path, *extra: str) -> list[str]:
    return ["sweep", "launch", "--spec", str(spec), "--output_dir", str(out), "--data_dir", "embedded",
            "--launcher", "local", "--no_progress", "--yes", *extra]


def expected_training_domain_table(sweep_dir: Path) -> dict[tuple[str, int], float]:
    """Mean over trials of the test accuracy at the best-validation checkpoint, from the raw files."""
    per_cell: dict[tuple[str, int], list[float]] = {}
    for run in sweep_dir.iterdir():
        if not (run / "done").exists():
            continue
        records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
        t = records[0]["args"]["test_envs"][0]
        train_envs = [i for i in range(3) if i != t]
        best = max(records, key=lambda r: np.mean([r[f"env{i}_out_acc"] for i in train_envs]))  # first max wins
        per_cell.setdefault((records[0]["args"]["algorithm"], t), []).append(best[f"env{t}_in_acc"])
    return {k: float(np.mean(v)) for k, v in per_cell.items()}


def csv_table(text: str) -> pd.DataFrame:
    table = pd.read_csv(io.StringIO(text))
    return table[(table["selection"] == "training") & (table["table"] == "test")]


def test_job_list_is_deterministic_and_hashed(tmp_path):
    spec = parse_spec({"algorithms": ["ERM", "IRM"], "datasets": ["ColoredMNIST", "RotatedMNIST"],
                       "n_hparams": 2, "n_trials": 3, "pairs": True})
    jobs = build_jobs(spec)
    # (3 singles + 3 pairs) + (6 singles + 15 pairs) environment sets, x 2 algorithms x 2 x 3
    assert len(jobs) == (6 + 21) * 2 * 2 * 3
    assert [j.job_id for j in jobs] == [j.job_id for j in build_jobs(spec)]
    assert len({j.job_id for j in jobs}) == len(jobs)
    assert jobs[0].job_id == job_id(jobs[0].args)
    assert jobs[0].args["steps"] == 5001 and jobs[0].args["checkpoint_freq"] == 100


def test_parts_are_sub_sweeps_of_the_top_level_keys():
    spec = parse_spec({
        "algorithms": ["ERM", "IRM"], "n_hparams": 1, "n_trials": 2, "steps": 10,
        "parts": [
            {"datasets": ["ColoredMNIST"], "test_envs": [[2]], "algorithm_hparams": {"IRM": {"irm_lambda": 5.0}}},
            {"datasets": ["RotatedMNIST"], "test_envs": [[0], [1]], "algorithms": ["ERM"], "steps": 20},
        ],
    })
    jobs = build_jobs(spec)
    first = parse_spec({"algorithms": ["ERM", "IRM"], "datasets": ["ColoredMNIST"], "test_envs": [[2]], "n_hparams": 1,
                        "n_trials": 2, "steps": 10, "algorithm_hparams": {"IRM": {"irm_lambda": 5.0}}})
    second = parse_spec({"algorithms": ["ERM"], "datasets": ["RotatedMNIST"], "test_envs": [[0], [1]], "n_hparams": 1,
                         "n_trials": 2, "steps": 20})
    assert [j.job_id for j in jobs] == [j.job_id for j in build_jobs(first) + build_jobs(second)]
    assert {j.args["steps"] for j in jobs if j.args["dataset"] == "RotatedMNIST"} == {20}
    assert [j.args["hparams"] for j in jobs if j.args["algorithm"] == "IRM"] == [{"irm_lambda": 5.0}] * 2


def test_modreg_table1_spec_runs_both_protocols():
    spec_path = Path(__file__).resolve().parents[1] / "sweeps" / "modreg_table1.toml"
    from domaingen.sweep.spec import load_spec

    jobs = build_jobs(load_spec(spec_path))
    mlp = [j for j in jobs if j.args["dataset"] == "IRMColoredMNIST"]
    assert {j.args["algorithm"] for j in jobs} == {"ERM", "ERM+ModReg", "IRM", "IRM+ModReg"}
    assert len(mlp) == 4 * 10 and {j.args["holdout_fraction"] for j in mlp} == {0.0}
    assert {j.args["steps"] for j in mlp} == {501}
    irm = next(j for j in mlp if j.args["algorithm"] == "IRM").args["hparams"]
    assert irm["irm_penalty_anneal_iters"] == 190 and irm["penalty_schedule"] == "irm_paper"
    others = [j for j in jobs if j.args["dataset"] != "IRMColoredMNIST"]
    by_net = {net: [(j.args["dataset"], tuple(j.args["test_envs"])) for j in others if j.args["hparams"]["featurizer"] == net]
              for net in ("MLP", "MNIST_CNN")}
    # part 2: MLP on RotatedMNIST 0 degrees; part 3: MNIST_CNN on ColoredMNIST -90% and RotatedMNIST 0 degrees
    assert sorted(set(by_net["MLP"])) == [("RotatedMNIST", (0,))] and len(by_net["MLP"]) == 4 * 3
    assert sorted(set(by_net["MNIST_CNN"])) == [("ColoredMNIST", (2,)), ("RotatedMNIST", (0,))]
    assert len(by_net["MNIST_CNN"]) == 4 * 3 * 2 and len(jobs) == 40 + 12 + 24


def test_modreg_table1_cpu_spec_is_part_1_of_the_full_spec_in_bf16_and_a_shorter_cnn_part():
    from domaingen.sweep.spec import load_spec

    sweeps = Path(__file__).resolve().parents[1] / "sweeps"
    full, cpu = (build_jobs(load_spec(sweeps / name)) for name in ("modreg_table1.toml", "modreg_table1_cpu.toml"))
    mlp = lambda jobs: [{**j.args, "precision": None} for j in jobs if j.args["dataset"] == "IRMColoredMNIST"]
    assert mlp(cpu) == mlp(full) and len(mlp(cpu)) == 40
    assert {j.args["precision"] for j in cpu} == {"bf16"}
    cnn = [j.args for j in cpu if j.args["dataset"] != "IRMColoredMNIST"]
    assert len(cnn) == 24 and {a["steps"] for a in cnn} == {1001} and {a["trial_seed"] for a in cnn} == {0, 1, 2}
    assert {(a["dataset"], tuple(a["test_envs"]), a["hparams"]["featurizer"]) for a in cnn} == \
        {("ColoredMNIST", (2,), "MNIST_CNN"), ("RotatedMNIST", (0,), "MNIST_CNN")}


def test_flags_build_the_same_job_list_as_a_spec(tmp_path, capsys):
    spec_path = write_spec(tmp_path)
    code, from_spec, _ = cli(capsys, "sweep", "launch", "--spec", str(spec_path), "--output_dir", str(tmp_path / "s"), "--dry")
    code2, from_flags, _ = cli(
        capsys, "sweep", "launch", "--algorithms", "ERM", "VREx", "--datasets", "ColoredMNIST", "--n_hparams", "1",
        "--n_trials", "2", "--steps", "6", "--checkpoint_freq", "2", "--hparams", json.dumps(FAST_HPARAMS | {"featurizer": "MLP", "mlp_width": 32}),
        "--output_dir", str(tmp_path / "s"), "--dry")
    assert code == code2 == 0
    assert from_spec == from_flags
    assert from_spec.count("domaingen train") == 12
    assert not (tmp_path / "s").exists()  # a dry run writes nothing


def _dry_commands(capsys, spec_path: Path, out: Path, *extra: str) -> list[str]:
    code, stdout, _ = cli(capsys, "sweep", "launch", "--spec", str(spec_path), "--output_dir", str(out), "--dry", *extra)
    assert code == 0
    return [line for line in stdout.splitlines() if line.startswith("domaingen train")]


def _flag(command: str, name: str) -> str:
    words = command.split()
    return words[words.index(name) + 1]


def test_trial_order_runs_every_job_of_a_trial_before_the_next_trial(tmp_path, capsys):
    spec_path = write_spec(tmp_path)
    by_spec = _dry_commands(capsys, spec_path, tmp_path / "s")
    by_trial = _dry_commands(capsys, spec_path, tmp_path / "s", "--order", "trial")
    assert sorted(by_spec) == sorted(by_trial) and len(by_trial) == 12
    trials = [int(_flag(c, "--trial_seed")) for c in by_trial]
    assert trials == [0] * 6 + [1] * 6
    # within a trial, the spec's order is kept: algorithm-major over the test environments
    assert [(_flag(c, "--algorithm"), _flag(c, "--test_envs")) for c in by_trial[:6]] == \
        [(a, e) for a in ("ERM", "VREx") for e in ("0", "1", "2")]
    assert by_spec != by_trial and [int(_flag(c, "--trial_seed")) for c in by_spec][:2] == [0, 1]


def test_an_unknown_order_is_refused_by_name(tmp_path, capsys):
    assert main(["sweep", "launch", "--spec", str(write_spec(tmp_path)), "--output_dir", str(tmp_path / "s"),
                 "--order", "random"]) == 2
    assert "argument --order: invalid choice: 'random' (choose from spec, trial)" in capsys.readouterr().err.replace("'spec', 'trial'", "spec, trial")


@pytest.mark.fast
def test_end_to_end_table_equals_direct_computation(tmp_path, capsys):
    spec, out = write_spec(tmp_path), tmp_path / "sweep"
    code, stdout, _ = cli(capsys, *launch_args(spec, out))
    assert code == 0 and "launched 12 jobs: 12 done" in stdout
    code, status, _ = cli(capsys, "sweep", "status", "--spec", str(spec), "--output_dir", str(out))
    assert "12 jobs" in status and "12 done, 0 incomplete, 0 failed, 0 not launched" in status
    code, text, _ = cli(capsys, "collect", "--input_dir", str(out), "--format", "csv")
    table = csv_table(text)
    expected = expected_training_domain_table(out)
    names = ["+90%", "+80%", "-90%"]
    for (algorithm, env), value in expected.items():
        row = table[(table["algorithm"] == algorithm) & (table["column"] == names[env])]
        assert row["mean"].iloc[0] == pytest.approx(value)
        assert row["n"].iloc[0] == 2
    # relaunching finds nothing to do
    code, stdout, _ = cli(capsys, *launch_args(spec, out))
    assert "nothing to launch" in stdout


def test_killed_sweep_resumes_only_missing_work_and_gives_the_same_table(tmp_path, capsys):
    spec = write_spec(tmp_path, steps=400, freq=50)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert cli(capsys, *launch_args(spec, straight))[0] == 0
    proc = subprocess.Popen([sys.executable, "-m", "domaingen", "-q", *launch_args(spec, killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    seen_mid_run = False
    deadline = time.time() + 120
    while time.time() < deadline and not seen_mid_run:
        # The done set is read once, before the records: a job that finishes between two reads
        # must not count both as the finished one and as the one caught mid-run. The job caught
        # must be early in its 400 steps (at most step 100 recorded), so the kill lands before it ends.
        done_now = {p.name for p in killed.iterdir() if (p / "done").exists()} if killed.exists() else set()
        for run in killed.glob("*/results.jsonl") if done_now else []:
            if run.parent.name not in done_now and 2 <= len(run.read_text().splitlines()) <= 3:
                seen_mid_run = True
                break
        else:
            time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert seen_mid_run, "no job was caught mid-run"
    done_before = {p.name: (p / "results.jsonl").read_bytes() for p in killed.iterdir() if (p / "done").exists()}
    # the jobs the kill interrupted after a checkpoint (on a loaded machine the one seen mid-run
    # may have finished before the kill landed; the next one has then begun)
    victims = [p for p in killed.iterdir() if (p / "checkpoint.pt").exists() and not (p / "done").exists()]
    assert 0 < len(done_before) < 12 and victims
    code, stdout, _ = cli(capsys, *launch_args(spec, killed))
    assert code == 0 and f"launched {12 - len(done_before)} jobs" in stdout
    for name, content in done_before.items():
        assert (killed / name / "results.jsonl").read_bytes() == content  # done work untouched
    for victim in victims:
        assert "resuming from step" in (victim / "log.txt").read_text()
    tables = [cli(capsys, "collect", "--input_dir", str(d), "--format", "csv")[1] for d in (straight, killed)]
    assert tables[0] == tables[1]


def test_garbage_lines_are_skipped_with_a_warning(tmp_path, capsys, caplog):
    spec, out = write_spec(tmp_path), tmp_path / "sweep"
    cli(capsys, *launch_args(spec, out))
    victim = sorted(out.glob("*/results.jsonl"))[0]
    victim.write_text(victim.read_text() + '{"step": 6, "env0_in' + "\n" + "garbage\n")
    code, text, _ = cli(capsys, "collect", "--input_dir", str(out), "--format", "markdown")
    assert code == 0 and "ColoredMNIST: test accuracy" in text
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(str(victim) in w and "unreadable line" in w for w in warnings)


def test_failed_runs_are_listed_and_not_counted(tmp_path, capsys):
    spec, out = write_spec(tmp_path), tmp_path / "sweep"
    cli(capsys, *launch_args(spec, out))
    victim = sorted(p for p in out.iterdir() if p.is_dir())[0]
    (victim / "done").unlink()
    (victim / "failed").write_text("DivergedError: non-finite loss at step 3\n")
    code, text, _ = cli(capsys, "collect", "--input_dir", str(out), "--show_trials")
    assert "Failed runs (1), not counted:" in text and victim.name in text
    assert "(n=1)" in text  # the cell that lost a trial says so


def test_different_spec_is_refused_unless_forced(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert cli(capsys, *launch_args(write_spec(tmp_path), out))[0] == 0
    other = write_spec(tmp_path, steps=4, name="other.toml")
    code, _, err = cli(capsys, *launch_args(other, out))
    assert code == 2 and "holds a sweep with a different spec (steps: 6 there, 4 now)" in err
    code, stdout, _ = cli(capsys, *launch_args(other, out, "--force"))
    assert code == 0 and "launched 12 jobs" in stdout


def test_delete_incomplete_removes_only_unfinished_jobs(tmp_path, capsys):
    spec, out = write_spec(tmp_path), tmp_path / "sweep"
    cli(capsys, *launch_args(spec, out))
    dirs = sorted(p for p in out.iterdir() if p.is_dir())
    (dirs[0] / "done").unlink()
    (dirs[1] / "done").unlink()
    (dirs[1] / "failed").write_text("boom\n")
    code, stdout, _ = cli(capsys, "sweep", "delete-incomplete", "--spec", str(spec), "--output_dir", str(out), "--yes")
    assert "deleted 2" in stdout
    assert not dirs[0].exists() and not dirs[1].exists() and all(d.exists() for d in dirs[2:])


BAD_SPECS = [
    ('algorithms = ["ERM"]\ndatasets = ["ColoredMNIST"]\nn_trails = 3\n', "bad.toml: unknown key 'n_trails'; did you mean n_trials?"),
    ('algorithms = ["ERN"]\ndatasets = ["ColoredMNIST"]\n', "unknown algorithm 'ERN' in 'algorithms'"),
    ('algorithms = ["ERM"]\ndatasets = ["CMNIST"]\n', "unknown dataset 'CMNIST' in 'datasets'"),
    ('algorithms = ["ERM"]\ndatasets = ["ColoredMNIST"]\nn_hparams = 0\n', "n_hparams must be at least 1, got 0 ("),
    ('algorithms = ["ERM"]\ndatasets = ["ColoredMNIST"]\ntest_envs = []\n', "the sweep has no jobs"),
    ('algorithms = ["ERM"]\ndatasets = ["ColoredMNIST"]\ntest_envs = [[5]]\n', "test environment 5 is out of range"),
    ('algorithms = ["ERM"]\ndatasets = ["ColoredMNIST"]\n[hparams]\nirm_lambda = 1.0\n',
     "irm_lambda unknown to ERM on ColoredMNIST; valid names: batch_size, featurizer, lr, mlp_depth, mlp_dropout, "
     "mlp_width, weight_decay; put algorithm-specific ones under [algorithm_hparams.NAME]"),
    ('algorithms = ["ERN"]\ndatasets = ["ColoredMNIST"]\n', "unknown algorithm 'ERN' in 'algorithms'; did you mean 'ERM'?"),
    ('algorithms = ["ERM"]\ndatasets = ["ColoredMNIST"]\ntest_envs = [2.5]\n', "test_envs must be a list of held-out sets, e.g. [2] "
     '(environment 2), ["-90%"] (by name) or [[0], [1, 2]] (two runs), got [2.5] ('),
    ('algorithms = ["ERM"\n', "is not valid TOML"),
    ('algorithms = ["ERM"]\n[[parts]]\ndatasets = ["CMNIST"]\n', "parts[0]: unknown dataset 'CMNIST'"),
    ('algorithms = ["ERM"]\n[[parts]]\ndatasets = ["ColoredMNIST"]\n[[parts.parts]]\nn_trials = 1\n', "parts do not nest"),
    ('algorithms = ["ERM"]\ndatasets = ["ColoredMNIST"]\nholdout_fraction = "a"\n', "holdout_fraction must be a number, got 'a' ("),
]


@pytest.mark.parametrize("text, message", BAD_SPECS, ids=[m for _, m in BAD_SPECS])
def test_bad_spec_gives_one_clear_line(tmp_path, capsys, text, message):
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    code, _, err = cli(capsys, "sweep", "launch", "--spec", str(spec), "--output_dir", str(tmp_path / "o"), "--yes")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_unwritable_output_dir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, _, err = cli(capsys, *launch_args(write_spec(tmp_path), blocker / "sweep"))
    assert code == 2 and err == (f"domaingen: error: --output_dir {blocker / 'sweep'}: {blocker} is a file, not a "
                                 "directory; choose another --output_dir\n")


def test_collect_without_finished_runs(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, _, err = cli(capsys, "collect", "--input_dir", str(tmp_path / "empty"))
    assert code == 2 and "no finished runs in" in err


def test_threads_are_divided_between_workers(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads_per_worker(2, cores=2) == 1
    assert threads_per_worker(1, cores=2) == 2
    assert threads_per_worker(3, cores=2) == 1
    assert threads_per_worker(4, cores=16) == 4


@pytest.mark.parametrize("value, workers, cores, threads", [
    ("1", 1, 2, 1),  # two launchers on a 2-core machine, each told one thread: 2 threads in all, not 4
    ("3", 4, 16, 3), ("8", 4, 16, 4),  # a cap, never more than the cores' share
    ("0", 1, 2, 2), ("many", 1, 2, 2), ("", 1, 2, 2),  # not a positive integer: no cap
])
def test_omp_num_threads_caps_the_threads_a_launcher_gives_its_workers(monkeypatch, value, workers, cores, threads):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert threads_per_worker(workers, cores=cores) == threads


def test_parallel_launcher_runs_every_job(tmp_path, capsys):
    spec, out = write_spec(tmp_path, steps=3), tmp_path / "sweep"
    args = [a if a != "local" else "parallel" for a in launch_args(spec, out)] + ["--workers", "2"]
    code, stdout, _ = cli(capsys, *args)
    assert code == 0 and "12 done" in stdout
    jobs = build_jobs(parse_spec({"algorithms": ["ERM", "VREx"], "datasets": ["ColoredMNIST"], "n_hparams": 1,
                                  "n_trials": 2, "steps": 3, "checkpoint_freq": 2,
                                  "hparams": {"featurizer": "MLP", "mlp_width": 32, "batch_size": 16}}))
    assert set(job_states(jobs, out).values()) == {"done"}


def test_slurm_launcher_through_submitit_local_executor(tmp_path, capsys):
    pytest.importorskip("submitit")
    spec = tmp_path / "one.toml"
    spec.write_text(SPEC.format(steps=3, freq=2).replace('["ERM", "VREx"]', '["ERM"]').replace("n_trials = 2", "n_trials = 1"))
    out = tmp_path / "sweep"
    args = [a if a != "local" else "slurm" for a in launch_args(spec, out)] + ["--slurm_cluster", "local", "--slurm_cpus", "1"]
    code, stdout, _ = cli(capsys, *args)
    assert code == 0 and "launched 3 jobs: 3 done" in stdout
    assert (out / "slurm_logs").is_dir()


def test_launch_asks_only_on_a_terminal(tmp_path, capsys, monkeypatch):
    spec, out = write_spec(tmp_path), tmp_path / "sweep"
    args = [a for a in launch_args(spec, out) if a != "--yes"]
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    code, stdout, _ = cli(capsys, *args)
    assert code == 1 and "not launched" in stdout


@pytest.mark.fast
def test_status_reads_the_recorded_spec(tmp_path, capsys):
    spec, out = write_spec(tmp_path, steps=3), tmp_path / "sweep"
    cli(capsys, *launch_args(spec, out))
    code, status, _ = cli(capsys, "sweep", "status", "--output_dir", str(out))
    assert code == 0 and "12 jobs" in status and "12 done" in status
    code, _, err = cli(capsys, "sweep", "status", "--output_dir", str(tmp_path / "nothing"))
    assert code == 2 and err.strip() == (f"domaingen: error: {tmp_path / 'nothing'} holds no sweep (no such directory): "
                                         "give the directory a sweep was launched into, or --spec FILE to count "
                                         "that spec's jobs there")


def test_slurm_jobs_requeue_themselves_with_the_same_arguments():
    submitit = pytest.importorskip("submitit")
    from domaingen.sweep.slurm import _RequeueableChunk

    job = _RequeueableChunk()
    chunk = [("abc", {"dataset": "ColoredMNIST"}), ("def", {"dataset": "RotatedMNIST"})]
    again = job.checkpoint(chunk, 2, 64)
    assert isinstance(again, submitit.helpers.DelayedSubmission)
    assert again.function is job and again.args == (chunk, 2, 64)


TWO_DATASETS = """
algorithms = ["ERM"]
n_hparams = 1
n_trials = 1
steps = 4
checkpoint_freq = 2

[hparams]
featurizer = "MLP"
mlp_width = 16
batch_size = 16

[[parts]]
datasets = ["ColoredMNIST"]
test_envs = [[2]]

[[parts]]
datasets = ["RotatedMNIST"]
test_envs = [[0], [1]]
"""


def test_collect_datasets_tabulates_one_part_as_if_it_were_alone(tmp_path, capsys):
    import shutil

    spec, out, alone = tmp_path / "spec.toml", tmp_path / "sweep", tmp_path / "alone"
    spec.write_text(TWO_DATASETS)
    assert cli(capsys, *launch_args(spec, out))[0] == 0
    alone.mkdir()
    for run in out.iterdir():
        if run.is_dir() and json.loads((run / "args.json").read_text())["dataset"] == "RotatedMNIST":
            shutil.copytree(run, alone / run.name)
    code, part, _ = cli(capsys, "collect", "--input_dir", str(out), "--datasets", "RotatedMNIST", "--format", "csv")
    assert code == 0 and part == cli(capsys, "collect", "--input_dir", str(alone), "--format", "csv")[1]
    assert "RotatedMNIST" in part and "ColoredMNIST" not in part
    # --fields sees only the fields of the chosen datasets' records (RotatedMNIST has env3-env5)
    colored = tmp_path / "colored"
    colored.mkdir()
    for run in out.iterdir():
        if run.is_dir() and json.loads((run / "args.json").read_text())["dataset"] == "ColoredMNIST":
            shutil.copytree(run, colored / run.name)
    fields = ("--fields", "env*_out_acc", "--format", "csv")
    code, part, _ = cli(capsys, "collect", "--input_dir", str(out), "--datasets", "ColoredMNIST", *fields)
    assert code == 0 and part == cli(capsys, "collect", "--input_dir", str(colored), *fields)[1]
    assert "env2_out_acc" in part and "env3_out_acc" not in part
    code, both, _ = cli(capsys, "collect", "--input_dir", str(out), "--datasets", "RotatedMNIST", "ColoredMNIST")
    assert code == 0 and "### ColoredMNIST" in both and "### RotatedMNIST" in both
    # a run left undone is counted with its own dataset only
    victim = next(run for run in out.iterdir() if (run / "args.json").exists()
                  and json.loads((run / "args.json").read_text())["dataset"] == "RotatedMNIST")
    (victim / "done").unlink()
    text = cli(capsys, "collect", "--input_dir", str(out), "--datasets", "ColoredMNIST")[1]
    assert "Incomplete" not in text and "1 done run," in text


def test_collect_datasets_names_what_the_directory_holds_when_a_name_is_absent(tmp_path, capsys):
    spec, out = tmp_path / "spec.toml", tmp_path / "sweep"
    spec.write_text(TWO_DATASETS)
    assert cli(capsys, *launch_args(spec, out))[0] == 0
    code, _, err = cli(capsys, "collect", "--input_dir", str(out), "--datasets", "PACS")
    assert code == 2 and err.strip() == (f"domaingen: error: --datasets PACS: no run of PACS in {out} "
                                         "(its datasets: ColoredMNIST, RotatedMNIST)")


TWO_ALGORITHMS = """
algorithms = ["ERM", "IRM", "ERM+ModReg"]
datasets = ["ColoredMNIST"]
test_envs = [[2]]
n_hparams = 1
n_trials = 2
steps = 4
checkpoint_freq = 2

[hparams]
featurizer = "MLP"
mlp_width = 16
batch_size = 16
"""


def test_collect_algorithms_keeps_those_runs_as_if_they_were_alone(tmp_path, capsys):
    import shutil

    spec, out, alone = tmp_path / "spec.toml", tmp_path / "sweep", tmp_path / "alone"
    spec.write_text(TWO_ALGORITHMS)
    assert cli(capsys, *launch_args(spec, out))[0] == 0
    alone.mkdir()
    for run in out.iterdir():  # IRM's runs alone, by their recorded algorithm: the filter done another way
        if run.is_dir() and json.loads((run / "args.json").read_text())["algorithm"] == "IRM":
            shutil.copytree(run, alone / run.name)
    assert len(list(alone.iterdir())) == 2
    for view in ([], ["trajectories", "--fields", "env*_out_acc"], ["draws"]):
        code, part, _ = cli(capsys, "collect", *view, "--input_dir", str(out), "--algorithms", "irm", "--format", "csv")
        assert code == 0 and part == cli(capsys, "collect", *view, "--input_dir", str(alone), "--format", "csv")[1]
        assert "IRM" in part and "ERM" not in part  # the exact name: not ERM, nor ERM+ModReg
    # labelled sources are each narrowed before their rows are labelled
    code, text, _ = cli(capsys, "collect", "trajectories", "--input_dir", f"A={out}", f"B={alone}",
                        "--algorithms", "IRM", "--fields", "env*_out_acc", "--format", "csv")
    assert code == 0 and "IRM (A)" in text and "IRM (B)" in text and "ERM" not in text
    # one source with a label: its rows are labelled, its numbers unchanged
    fields = ("--fields", "env*_out_acc", "--format", "csv")
    code, one, _ = cli(capsys, "collect", "trajectories", "--input_dir", f"B={alone}", *fields)
    plain = cli(capsys, "collect", "trajectories", "--input_dir", str(alone), *fields)[1]
    assert code == 0 and "IRM (B)" in one and one.replace("IRM (B)", "IRM") == plain
    code, _, err = cli(capsys, "collect", "--input_dir", str(out), "--algorithms", "VREx")
    assert code == 2 and err.strip() == (f"domaingen: error: --algorithms VREx: no run of VREx in {out} "
                                         "(its algorithms: ERM, ERM+ModReg, IRM)")


THREE_PARTS = """
algorithms = ["ERM"]
n_hparams = 1
n_trials = 2
steps = 4
checkpoint_freq = 2

[hparams]
featurizer = "MLP"
mlp_width = 16
batch_size = 16

[[parts]]
datasets = ["ColoredMNIST"]
test_envs = [[2]]

[[parts]]
datasets = ["RotatedMNIST"]
test_envs = [[0]]

[[parts]]
datasets = ["ColoredMNIST"]
test_envs = [[0]]
n_trials = 1
"""


def test_parts_launch_one_part_as_a_sweep_of_its_own(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(THREE_PARTS)
    whole = _dry_commands(capsys, spec, tmp_path / "s")
    assert len(whole) == 2 + 2 + 1
    # the same commands as the whole spec's, filtered by what only part 2 (and 3) has, in the given order
    assert _dry_commands(capsys, spec, tmp_path / "s", "--parts", "2") == \
        [c for c in whole if _flag(c, "--dataset") == "RotatedMNIST"]
    part3 = [c for c in whole if _flag(c, "--test_envs") == "0" and _flag(c, "--dataset") == "ColoredMNIST"]
    assert _dry_commands(capsys, spec, tmp_path / "s", "--parts", "3", "2") == \
        part3 + [c for c in whole if _flag(c, "--dataset") == "RotatedMNIST"]
    out = tmp_path / "part2"
    assert cli(capsys, *launch_args(spec, out, "--parts", "2"))[0] == 0
    recorded = json.loads((out / "sweep.json").read_text())
    assert [p["datasets"] for p in recorded["parts"]] == [["RotatedMNIST"]]
    runs = [json.loads((r / "args.json").read_text()) for r in out.iterdir() if (r / "done").exists()]
    assert sorted((r["dataset"], r["trial_seed"]) for r in runs) == [("RotatedMNIST", 0), ("RotatedMNIST", 1)]
    # resuming it needs the same --parts; the whole spec is a different sweep for this directory
    code, stdout, _ = cli(capsys, *launch_args(spec, out, "--parts", "2"))
    assert code == 0 and "2 jobs: 2 done" in stdout
    code, _, err = cli(capsys, *launch_args(spec, out))
    assert code == 2 and "holds a sweep with a different spec (parts: [{" in err and len(err.splitlines()) == 1
    code, stdout, _ = cli(capsys, "sweep", "status", "--output_dir", str(out))  # its own recorded spec
    assert code == 0 and "2 jobs" in stdout and "done" in stdout
    code, _, err = cli(capsys, "sweep", "status", "--output_dir", str(out), "--parts", "2")
    assert code == 2 and "--parts needs --spec: it numbers the parts of the spec file" in err


@pytest.mark.parametrize("parts, message", [
    (["4"], "--parts 4: SPEC has parts 1 to 3"),
    (["0", "2"], "--parts 0: SPEC has parts 1 to 3"),
    (["2", "2"], "--parts names a part twice (2 2)"),
])
def test_bad_parts_are_refused_in_one_line(tmp_path, capsys, parts, message):
    spec = tmp_path / "spec.toml"
    spec.write_text(THREE_PARTS)
    code, _, err = cli(capsys, "sweep", "launch", "--spec", str(spec), "--output_dir", str(tmp_path / "o"), "--dry",
                       "--parts", *parts)
    assert code == 2 and message.replace("SPEC", str(spec)) in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_parts_of_a_spec_without_parts_is_refused(tmp_path, capsys):
    spec = write_spec(tmp_path)
    code, _, err = cli(capsys, "sweep", "launch", "--spec", str(spec), "--output_dir", str(tmp_path / "o"), "--dry",
                       "--parts", "1")
    assert code == 2 and f"--parts: {spec} has no [[parts]]; launch it whole" in err


def test_spec_names_in_any_case_give_the_same_jobs():
    lower = parse_spec({"algorithms": ["erm", "irm+modreg"], "datasets": ["coloredmnist"], "n_hparams": 1,
                        "n_trials": 1, "test_envs": [2], "algorithm_hparams": {"irm+modreg": {"irm_lambda": 5.0}}})
    exact = parse_spec({"algorithms": ["ERM", "IRM+ModReg"], "datasets": ["ColoredMNIST"], "n_hparams": 1,
                        "n_trials": 1, "test_envs": [[2]], "algorithm_hparams": {"IRM+ModReg": {"irm_lambda": 5.0}}})
    assert lower.algorithms == ["ERM", "IRM+ModReg"] and lower.datasets == ["ColoredMNIST"]
    assert [j.job_id for j in build_jobs(lower)] == [j.job_id for j in build_jobs(exact)]
