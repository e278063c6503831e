"""retain_freed_memory: a CPU run reuses freed memory instead of faulting in fresh pages, and computes the same numbers."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from domaingen.run import allocator
from domaingen.testing import VOLATILE_FIELDS

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
needs_glibc = pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")

# In a fresh process (the setting is process-wide): allocate and free a 64 MiB tensor ten times to
# settle the heap, then count the minor page faults of ten more.
CHURN = """
import resource, sys, torch
from domaingen.run.allocator import retain_freed_memory
print(retain_freed_memory() if sys.argv[1] == "on" else False)
n = 16 * 2**20
def churn():
    for _ in range(10):
        x = torch.ones(n) * 2
        del x
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _churn_faults(setting: str) -> tuple[bool, int]:
    env = {k: v for k, v in os.environ.items() if k != allocator.ENV}
    out = subprocess.run([sys.executable, "-c", CHURN, setting], env=env, capture_output=True, text=True, check=True)
    in_force, faults = out.stdout.split()
    return in_force == "True", int(faults)


@needs_glibc
def test_freed_tensors_are_reused_without_faulting_in_fresh_pages():
    retained, faults_retained = _churn_faults("on")
    default, faults_default = _churn_faults("off")
    assert retained and not default
    one_tensor_pages = 64 * 2**20 // os.sysconf("SC_PAGE_SIZE")
    # glibc's default maps both 64 MiB tensors of each round afresh: at least one fault per huge page
    assert faults_default >= 20 * (64 * 2**20) // (2 * 2**20)
    assert faults_retained <= one_tensor_pages and faults_retained * 10 < faults_default


def test_the_environment_variable_leaves_glibc_alone(monkeypatch):
    monkeypatch.setenv(allocator.ENV, "0")
    monkeypatch.setattr(allocator, "_glibc", lambda: pytest.fail("mallopt must not be reached"))
    assert allocator.retain_freed_memory() is False


def test_without_glibc_nothing_is_set(monkeypatch):
    monkeypatch.delenv(allocator.ENV, raising=False)
    monkeypatch.setattr(allocator, "_retained", False)
    monkeypatch.setattr(allocator, "_glibc", lambda: None)
    assert allocator.retain_freed_memory() is False


def _records(run: Path, setting: str) -> list[dict]:
    env = {**os.environ, allocator.ENV: setting}
    hparams = json.dumps({"featurizer": "MLP", "mlp_width": 512, "batch_size": 1024})
    subprocess.run([sys.executable, "-m", "domaingen", "-q", "train", "--dataset", "ColoredMNIST",
                    "--algorithm", "IRM+ModReg", "--test_envs", "2", "--data_dir", "embedded", "--steps", "4",
                    "--checkpoint_freq", "2", "--hparams", hparams, "--output_dir", str(run)],
                   env=env, check=True, capture_output=True)
    lines = (run / "results.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in VOLATILE_FIELDS} for line in lines]


@needs_glibc
def test_a_cpu_run_computes_the_same_records_with_and_without_it(tmp_path):
    kept = _records(tmp_path / "kept", "1")
    default = _records(tmp_path / "default", "0")
    assert [r["step"] for r in kept] == [0, 2, 3]
    assert kept == default


def test_bench_allocator_without_real_mnist_says_why_in_one_line(capsys):
    from domaingen.bench.benchmarks import main as bench_main

    assert bench_main(["--only", "allocator", "--data_dir", "embedded"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("domaingen.bench: --only allocator: its IRMColoredMNIST run failed: domaingen: error: IRMColoredMNIST "
                   "splits MNIST's 60,000 training digits as the IRM paper does and needs the real MNIST files; the "
                   "embedded sample is not enough (point --data_dir at a directory with MNIST/raw)")
