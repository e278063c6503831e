"""bench --only fullrun / jobs: the run estimate and the baseline checkout (timings are not asserted)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from domaingen.bench.baseline import baseline_commit, estimate, export_tree


def test_estimate_of_a_selection_run_and_an_all_run():
    measured = {"step": 0.1, "full_eval": 10.0, "partial_eval": 4.0, "default_eval_splits": "selection"}
    run = estimate(measured)
    # 5001 steps; checkpoints at 0, 100, ..., 5000: 51, the last one full
    assert (run.partial_evals, run.full_evals) == (50, 1)
    assert run.total == pytest.approx(5001 * 0.1 + 50 * 4.0 + 10.0)
    final = estimate({**measured, "default_eval_splits": "final", "partial_eval": 1.0, "final_eval": 3.0})
    assert final.total == pytest.approx(5001 * 0.1 + 50 * 1.0 + 10.0 + 3.0)
    old = estimate({"step": 0.1, "full_eval": 10.0, "default_eval_splits": "all"})
    assert (old.partial_evals, old.full_evals) == (0, 51) and old.total == pytest.approx(500.1 + 510.0)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_the_baseline_is_main_or_the_commit_before_eval_plan(tmp_path):
    repo = tmp_path / "repo"
    (repo / "domaingen").mkdir(parents=True)
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    for key, value in (("user.name", "t"), ("user.email", "t@t")):
        git(repo, "config", key, value)
    (repo / "domaingen" / "__init__.py").write_text("OLD = 1\n")
    (repo / "README.md").write_text("x\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "old")
    old = git(repo, "rev-parse", "HEAD")
    assert baseline_commit(repo, "main") == old  # main without the change is its own baseline
    (repo / "domaingen" / "eval_plan.py").write_text("NEW = 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "speed")
    (repo / "domaingen" / "later.py").write_text("\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "later")
    assert baseline_commit(repo, "main") == old
    later = git(repo, "rev-parse", "HEAD")
    assert baseline_commit(repo, later) == later and baseline_commit(repo, "HEAD~1") != old  # any other rev as given
    tree = export_tree(repo, old, tmp_path / "export")
    assert sorted(p.name for p in tree.rglob("*") if p.is_file()) == ["__init__.py"]
    assert (tree / "domaingen" / "__init__.py").read_text() == "OLD = 1\n"


def test_jobs_comparison_alternates_the_trees_and_reports_the_medians(monkeypatch, tmp_path):
    import domaingen.bench.baseline as bb

    calls = []
    walls = {"old": iter([40.0, 36.0, 38.0]), "new": iter([25.0, 27.0, 24.0])}

    def fake_sweep(tree, spec, out, data_dir):
        kind = "old" if Path(tree).name == "baseline" else "new"
        calls.append(kind)
        wall = next(walls[kind])
        write_run(Path(out) / "run", [(0, 0.5, 0.25), (40, 0.1, 0.75)], final_seconds=0.5)
        return wall, 2 * wall

    monkeypatch.setattr(bb, "baseline_commit", lambda repo, rev: "abcdef1234")
    monkeypatch.setattr(bb, "export_tree", lambda repo, commit, into: into)
    monkeypatch.setattr(bb, "sweep_seconds", fake_sweep)
    monkeypatch.setattr(bb, "startup_seconds", lambda tree: 3.0)
    rows = bb.jobs_rows(tmp_path, "data", n_jobs=6, baseline="main", here=tmp_path / "tree", repeats=3)
    assert calls == ["old", "new"] * 3
    # medians 25 / 38 s; CPU time 50 / 76 s
    assert rows[0][1] == "25.0 s / 38.0 s = 66% (CPU time 50 / 76 s = 66%)"
    assert rows[1][1] == f"{6 * 3600 / 25:.0f} / {6 * 3600 / 38:.0f}"
    assert rows[2][1] == "25.0/40.0, 27.0/36.0, 24.0/38.0"
    assert "medians of 3" in rows[0][0]
    # the last sweep of this tree (24 s): steps 0.5 + 40 x 0.1, evaluations 1.0, final 0.5, start-up 3
    breakdown = {name.removeprefix("  - "): value for name, value in rows[4:]}
    assert rows[3][0] == "  where this tree's last sweep went (24.0 s)"
    assert breakdown["training steps (the records' step_time)"] == f"4.5 s ({4.5 / 24:.0%})"
    assert breakdown["checkpoint evaluations (the records' eval_time)"] == f"1.0 s ({1 / 24:.0%})"
    assert breakdown["final evaluations of the selected checkpoints (final.json)"] == f"0.5 s ({0.5 / 24:.0%})"
    assert breakdown["process start-up: imports, parser, torch._dynamo (timed apart)"] == f"3.0 s ({3 / 24:.0%})"
    rest = 24 - 4.5 - 1.0 - 0.5 - 3.0
    assert list(breakdown.values())[-1] == f"{rest:.1f} s ({rest / 24:.0%})"


def write_run(run: Path, checkpoints, final_seconds=None) -> None:
    """A run directory whose records hold (step, mean step_time, eval_time) per checkpoint."""
    import json

    run.mkdir(parents=True, exist_ok=True)
    run.joinpath("results.jsonl").write_text("".join(
        json.dumps({"step": step, "step_time": step_time, "eval_time": eval_time}) + "\n"
        for step, step_time, eval_time in checkpoints))
    if final_seconds is not None:
        run.joinpath("final.json").write_text(json.dumps({"seconds": final_seconds}))


def test_recorded_seconds_weigh_each_mean_step_time_by_the_steps_it_covers(tmp_path):
    from domaingen.bench.baseline import recorded_seconds

    # checkpoints at 0 (one step), 50 (50 steps at 0.2 s), 100 (50 at 0.4 s); a run from before eval_time
    write_run(tmp_path / "a", [(0, 1.0, 2.0), (50, 0.2, 3.0), (100, 0.4, 4.0)], final_seconds=1.5)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "results.jsonl").write_text('{"step": 0, "step_time": 0.5}\n{"step": 9, "step_time": 0.1}\n')
    totals = recorded_seconds(tmp_path)
    assert totals["steps"] == pytest.approx(1.0 + 50 * 0.2 + 50 * 0.4 + 0.5 + 9 * 0.1)
    assert totals["evaluations"] == pytest.approx(9.0)
    assert totals["final"] == pytest.approx(1.5)


def test_gpu_jobs_times_local_then_each_jobs_per_gpu_and_divides_by_local(tmp_path):
    from domaingen.bench.baseline import gpu_jobs_rows

    walls = iter([100.0, 50.0, 40.0])
    seen = []

    def run_sweep(spec, out, launcher):
        seen.append((tuple(launcher), "n_trials = 8" in Path(spec).read_text()))
        return next(walls), 0.0

    rows = gpu_jobs_rows("embedded", 24, 41, [1, 3], cuda_available=True, run_sweep=run_sweep)
    assert seen == [(("--launcher", "local"), True),
                    (("--launcher", "parallel", "--jobs_per_gpu", "1"), True),
                    (("--launcher", "parallel", "--jobs_per_gpu", "3"), True)]
    assert [r[1] for r in rows] == [
        f"100.0 s, {24 * 3600 / 100:.0f} jobs per hour, 1.00x local",
        f"50.0 s, {24 * 3600 / 50:.0f} jobs per hour, 2.00x local",
        f"40.0 s, {24 * 3600 / 40:.0f} jobs per hour, 2.50x local",
    ]
    assert rows[2][0] == "24 ColoredMNIST MLP jobs of 41 steps, --launcher parallel --jobs_per_gpu 3"


def test_gpu_jobs_without_cuda_or_with_a_bad_count_is_one_line_and_exit_2(capsys, monkeypatch):
    import torch

    from domaingen.bench.baseline import gpu_jobs_rows
    from domaingen.bench.benchmarks import main as bench_main
    from domaingen.errors import DomaingenError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_main(["--only", "gpujobs", "--data_dir", "embedded"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("domaingen.bench: --only gpujobs times sweeps on CUDA GPUs, and torch sees none here "
                   "(torch.cuda.is_available() is False)")
    with pytest.raises(DomaingenError, match=r"^--jobs_per_gpu takes values of at least 1, got \[0\]$"):
        gpu_jobs_rows("embedded", jobs_per_gpu=[0], cuda_available=True)
