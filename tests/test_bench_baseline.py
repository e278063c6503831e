"""bench --only fullrun / jobs: the run estimate and the baseline checkout (timings are not asserted)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from domaingen.bench_baseline import baseline_commit, estimate, export_tree


def test_estimate_of_a_selection_run_and_an_all_run():
    measured = {"step": 0.1, "full_eval": 10.0, "partial_eval": 4.0, "default_eval_splits": "selection"}
    run = estimate(measured)
    # 5001 steps; checkpoints at 0, 100, ..., 5000: 51, the last one full
    assert (run.partial_evals, run.full_evals) == (50, 1)
    assert run.total == pytest.approx(5001 * 0.1 + 50 * 4.0 + 10.0)
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
    tree = export_tree(repo, old, tmp_path / "export")
    assert sorted(p.name for p in tree.rglob("*") if p.is_file()) == ["__init__.py"]
    assert (tree / "domaingen" / "__init__.py").read_text() == "OLD = 1\n"
