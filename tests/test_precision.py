"""--precision auto: a pure function of the hardware's flags, recorded in args, fixed for a run's lifetime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import FAST_HPARAMS
from domaingen.run import precision
from domaingen.errors import DomaingenError
from domaingen.run.precision import auto_precision, cpu_flags, emulated_bf16_warning, resolve_precision
from domaingen.run.rundir import RunDirectory
from domaingen.sweep.spec import SpecError, build_jobs, parse_spec
from domaingen.run.training import TrainConfig, _run_precision, train

ZEN5 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n\nprocessor\t: 1\n"
SAPPHIRE_RAPIDS = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
AVX2_ONLY = "flags\t\t: fpu sse2 avx avx2 fma\n"
GRAVITON = "Features\t: fp asimd bf16 sve\n"


def test_cpu_flags_are_read_from_cpuinfo_text():
    assert cpu_flags(ZEN5) == {"fpu", "sse2", "avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
    assert "amx_bf16" in cpu_flags(SAPPHIRE_RAPIDS)
    assert cpu_flags("") == set()


@pytest.mark.parametrize("device, text, cuda_native, expected", [
    ("cpu", ZEN5, False, "bf16"),  # AVX-512 bf16
    ("cpu", SAPPHIRE_RAPIDS, False, "bf16"),  # AMX
    ("cpu", AVX2_ONLY, False, "fp32"),  # bf16 would be emulated, slower than fp32
    ("cpu", GRAVITON, False, "fp32"),  # an arm64 'bf16' feature is not one of the two
    ("cpu", "", False, "fp32"),  # no /proc/cpuinfo
    ("cuda", AVX2_ONLY, True, "bf16"),  # Ampere or later: the CPU does not matter
    ("cuda", ZEN5, False, "fp32"),  # a GPU without native bf16
    ("mps", ZEN5, True, "fp32"),
])
def test_auto_precision_is_a_function_of_the_flags(device, text, cuda_native, expected):
    assert auto_precision(device, cpu_flags(text), cuda_native) == expected


EMULATED_CPU = ("bf16 on a CPU without AMX or AVX-512 bf16 (amx_bf16, avx512_bf16) is emulated and runs slower "
                "than fp32; --precision auto picks fp32 here")


@pytest.mark.parametrize("precision_, device, text, cuda_native, expected", [
    ("bf16", "cpu", AVX2_ONLY, True, EMULATED_CPU),
    ("bf16", "cpu", GRAVITON, True, EMULATED_CPU),
    ("bf16", "cpu", ZEN5, False, None),
    ("bf16", "cpu", SAPPHIRE_RAPIDS, False, None),
    ("fp32", "cpu", AVX2_ONLY, False, None),
    ("bf16", "cuda", AVX2_ONLY, True, None),
    ("bf16", "cuda", ZEN5, False,
     "bf16 on a GPU without native bf16 (before Ampere) is emulated; --precision auto picks fp32 here"),
])
def test_emulated_bf16_is_named_exactly_where_auto_would_not_pick_it(precision_, device, text, cuda_native, expected):
    assert emulated_bf16_warning(precision_, device, cpu_flags(text), cuda_native) == expected
    # the warning and auto agree: warned precisely where auto means fp32
    if precision_ == "bf16":
        assert (expected is None) == (auto_precision(device, cpu_flags(text), cuda_native) == "bf16")


@pytest.mark.parametrize("text, warned", [(AVX2_ONLY, True), (ZEN5, False)])
def test_a_bf16_run_on_an_emulating_cpu_says_so_in_its_log(tmp_path, monkeypatch, caplog, text, warned):
    monkeypatch.setattr(precision, "read_cpu_flags", lambda path="/proc/cpuinfo": cpu_flags(text))
    with caplog.at_level("WARNING", logger="domaingen"):
        train(TrainConfig(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(tmp_path / "run"), data_dir="embedded",
                          steps=1, checkpoint_freq=1, hparams=FAST_HPARAMS, precision="bf16", device="cpu"))
    assert any(r.getMessage() == EMULATED_CPU for r in caplog.records) == warned
    assert (EMULATED_CPU in (tmp_path / "run" / "log.txt").read_text()) == warned


def test_explicit_precisions_pass_through(monkeypatch):
    monkeypatch.setattr(precision, "read_cpu_flags", lambda path="/proc/cpuinfo": cpu_flags(ZEN5))
    assert resolve_precision("fp32", "cpu") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"
    assert resolve_precision("auto", "cpu") == "bf16"
    monkeypatch.setattr(precision, "read_cpu_flags", lambda path="/proc/cpuinfo": cpu_flags(AVX2_ONLY))
    assert resolve_precision("auto", "cpu") == "fp32"


def test_auto_run_records_what_it_ran_in(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(out), data_dir="embedded", steps=3,
                      checkpoint_freq=2, hparams=FAST_HPARAMS, precision="auto", device="cpu"))
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    expected = "bf16" if ("avx512_bf16" in info or "amx_bf16" in info) else "fp32"
    args = json.loads((out / "args.json").read_text())
    assert args["precision"] == "auto" and args["resolved_precision"] == expected
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["args"]["resolved_precision"] for r in records] == [expected, expected]


def test_a_run_keeps_the_precision_it_started_with(tmp_path, monkeypatch):
    # resumed on a machine whose auto means fp32, a run started in bf16 stays in bf16
    monkeypatch.setattr(precision, "read_cpu_flags", lambda path="/proc/cpuinfo": cpu_flags(AVX2_ONLY))
    cpu = torch.device("cpu")
    fresh = RunDirectory(tmp_path / "fresh")
    assert _run_precision(fresh, "auto", cpu) == "fp32"
    started = RunDirectory(tmp_path / "started")
    started.create({"precision": "auto", "resolved_precision": "bf16"})
    assert _run_precision(started, "auto", cpu) == "bf16"


def test_auto_in_a_spec_hashes_the_request_not_the_machine(monkeypatch):
    spec = parse_spec({"algorithms": ["ERM"], "datasets": ["ColoredMNIST"], "n_hparams": 1, "n_trials": 1,
                       "precision": "auto"})
    jobs = build_jobs(spec)
    assert {j.args["precision"] for j in jobs} == {"auto"}
    monkeypatch.setattr(precision, "read_cpu_flags", lambda path="/proc/cpuinfo": cpu_flags(AVX2_ONLY))
    assert [j.job_id for j in build_jobs(spec)] == [j.job_id for j in jobs]
    with pytest.raises(SpecError, match=r"precision must be one of fp32, bf16, auto, got 'fp16' \(spec, key 'precision'\)"):
        parse_spec({"algorithms": ["ERM"], "datasets": ["ColoredMNIST"], "precision": "fp16"})
    with pytest.raises(DomaingenError, match=r"precision must be one of fp32, bf16, auto, got .fp16. \(TrainConfig\)"):
        train(TrainConfig(dataset="ColoredMNIST", algorithm="ERM", output_dir="unused", precision="fp16"))
