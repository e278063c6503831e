"""`bench --only gpu`: its refusal without CUDA, the protocol projection's arithmetic, and its rows
built from made-up figures (the measurements themselves need a GPU)."""

from __future__ import annotations

import pytest
import torch

from domaingen.bench import gpu
from domaingen.bench.gpu import GpuFigures, eval_images_per_run, figure_rows, gpu_rows, protocol_gpu_hours


def test_without_cuda_it_says_so_in_one_line_and_exits_2(capsys, monkeypatch):
    from domaingen.bench.benchmarks import main as bench_main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_main(["--only", "gpu", "--data_dir", "embedded"]) == 2
    err = capsys.readouterr().err
    assert err == ("domaingen.bench: --only gpu measures on a CUDA GPU and torch sees none here "
                   "(torch.cuda.is_available() is False); run it on a machine with one\n")


def test_the_projection_by_hand():
    # 50 checkpoints of 2 x 4666 out-split images, the last of all 70,000, the final one of 23,333
    assert eval_images_per_run() == 50 * 9332 + 70000 + 23333 == 559933
    # 500 steps/s, 350,000 images/s: a run is 5001 / 500 + 559933 / 350000 = 10.002 + 1.59981 s
    assert protocol_gpu_hours(500.0, 350_000.0) == pytest.approx(3780 * 11.60181 / 3600)
    assert protocol_gpu_hours(500.0, 350_000.0) == pytest.approx(12.18190, abs=1e-5)
    assert protocol_gpu_hours(1000.0, 1e12, runs=36, steps=1000, images=0) == pytest.approx(0.01)


def figures() -> GpuFigures:
    return GpuFigures(
        gpu="NVIDIA H100 80GB HBM3",
        runs={"2001 fp32": {"wall": 25.0, "rss": 1.5}, "501 fp32": {"wall": 14.0, "rss": 1.4},
              "501 bf16": {"wall": 12.5, "rss": 1.4}, "DomainBed 2001": {"wall": 84.0, "rss": 1.8},
              "DomainBed 501": {"wall": 32.2, "rss": 1.8}},
        steps_ms={"eager fp32": 3.3, "eager bf16": 3.9,
                  "captured fp32": "not available (--compile_step cudagraphs fell back to eager; see the warning)",
                  "in a run captured fp32": 2.0, "8x eager fp32": 11.8},
        shared={1: 311.0, 4: 443.0, 8: 443.0, 16: 700.0}, shared_seconds=4.0,
        vmap={8: 2.71, 32: "out of memory"},
        eval_rate={"2048 fp32": 350_000.0, "8192 bf16": 360_000.0},
        sweep={"wall": 148.0, "jobs": 36, "startup_mean": 1.25, "startup_max": 7.5},
        resnet_ms={"fp32": 42.0, "bf16": 30.0},
    )


def test_rows_from_made_up_figures_carry_the_targets():
    rows = dict(map(tuple, figure_rows(figures())))
    assert rows["GPU"] == "NVIDIA H100 80GB HBM3"
    assert rows["one ERM run, MNIST_CNN, 2001 steps and 21 evaluations"] == (
        "25.0 s, 1.50 GB RSS; DomainBed 84.0 s, 1.80 GB (3.36x)")
    assert rows["the same, 501 steps and 6 evaluations, bf16"] == (
        "12.5 s, 1.40 GB RSS; DomainBed 32.2 s, 1.80 GB (2.58x)")
    assert rows["one ERM step, 3 x 64, --compile_step cudagraphs, fp32 (in process)"] == (
        "not available (--compile_step cudagraphs fell back to eager; see the warning)")
    assert rows["one step of a --compile_step cudagraphs run, fp32 (2 x 64: sampling and logging included, "
                "run records)"] == "2.00 ms"
    # the target is the 3 x 64 step's: a real run's 2 x 64 step is other work and does not count
    assert rows["the fastest MNIST_CNN step above"] == "3.30 ms (target ≤ 1.5 ms: not met)"
    assert rows["processes sharing the GPU, eager fp32 steps/s in all (4 s windows)"] == (
        "1: 311, 4: 443, 8: 443, 16: 700 (target ≥ 700 steps/s: met)")
    assert rows["32 runs stacked with vmap, MNIST_CNN, per run-step"] == "out of memory"
    assert rows["8 runs stacked with vmap, MNIST_CNN, per run-step"] == "2.71 ms"
    assert rows["evaluation, 70,000 images, images/s"] == "batch 2048 fp32: 350k, batch 8192 bf16: 360k"
    sweep = [v for k, v in rows.items() if k.startswith("36-job ERM sweep")]
    assert sweep == ["148.0 s (target ≤ 75 s: not met)"]
    assert rows["ResNet-50 step, batch 96 (3 x 32, 224 x 224), bf16"] == "30.0 ms (3,200 images/s)"
    # 700 steps/s and 360,000 images/s: 3780 x (5001 / 700 + 559933 / 360000) / 3600 = 9.134 GPU-hours
    projection = [v for k, v in rows.items() if k.startswith("whole protocol (3780 runs")]
    assert projection == [f"{3780 * (5001 / 700 + 559933 / 360000) / 3600:.1f} GPU-hours "
                          "(target ≤ 8 GPU-hours: not met)"] == ["9.1 GPU-hours (target ≤ 8 GPU-hours: not met)"]
    assert rows["whole protocol, DomainBed, one run at a time (its 2001-step run's seconds per step)"] == (
        f"{3780 * 5001 * 84.0 / 2001 / 3600:.0f} GPU-hours")


def test_gpu_rows_run_the_measurement_they_are_given_and_time_themselves():
    seen = []

    def fake(data_dir, peer, progress):
        seen.append((data_dir, peer))
        return GpuFigures(gpu="fake", steps_ms={"eager fp32": 1.2})

    rows = gpu_rows("/data", "/peer", measured=fake)
    assert seen == [("/data", "/peer")]
    assert rows[0] == ["GPU", "fake"] and rows[-2] == ["the fastest MNIST_CNN step above",
                                                       "1.20 ms (target ≤ 1.5 ms: met)"]
    assert rows[-1][0] == "the section's own wall time"


def test_the_step_and_the_captured_fallback_on_the_cpu(monkeypatch, tmp_path):
    device = torch.device("cpu")
    model, batches = gpu.erm_model(device, per_env=4)
    assert [x.shape for x, _ in batches] == [torch.Size([4, 2, 28, 28])] * 3
    before = [p.detach().clone() for p in model.parameters()]
    assert gpu.step_ms(model, batches, device, "fp32", steps=2, warmup=1) > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # it trained
    monkeypatch.setattr(gpu, "has_setting", lambda name: False)
    assert gpu.captured_step_ms("embedded", tmp_path, "fp32") == (
        "not available (this tree has no --compile_step setting)")
    assert gpu.has_setting.__name__ == "<lambda>" and not gpu.has_setting("compile_step")


def test_the_sweep_is_the_issues_36_jobs():
    import tomllib

    from domaingen.sweep.spec import build_jobs, parse_spec

    jobs = build_jobs(parse_spec(tomllib.loads(gpu.SWEEP_SPEC)))
    per_dataset = {name: sum(j.args["dataset"] == name for j in jobs) for name in ("ColoredMNIST", "RotatedMNIST")}
    assert per_dataset == {"ColoredMNIST": 3 * 4, "RotatedMNIST": 6 * 4}
    assert {(j.args["steps"], j.args["checkpoint_freq"], j.args["algorithm"]) for j in jobs} == {(501, 100, "ERM")}


def test_a_part_that_fails_is_recorded_and_the_next_part_still_runs():
    figures, said, ran = GpuFigures(gpu="fake"), [], []

    def broken():
        raise RuntimeError("CUDA error: out of memory\nmore detail")

    gpu.attempt(figures, "vmap", broken, said.append)
    gpu.attempt(figures, "evaluation", lambda: ran.append("evaluation"), said.append)
    assert figures.failures == {"vmap": "RuntimeError: CUDA error: out of memory"}
    assert ran == ["evaluation"]
    assert said[:2] == ["vmap", "vmap: failed (RuntimeError: CUDA error: out of memory)"]
    assert said[2] == "evaluation" and said[3].startswith("evaluation: done in ")
    assert ["vmap: failed", "RuntimeError: CUDA error: out of memory"] in figure_rows(figures)


def test_the_in_process_captured_step_says_why_on_a_cpu_and_step_ms_times_the_update_given():
    device = torch.device("cpu")
    assert gpu.captured_inprocess_ms(device, "fp32", per_env=4) == (
        "not available (--compile_step cudagraphs trains eagerly on cpu; see the warning)")
    model, batches = gpu.erm_model(device, per_env=4)
    calls = []
    assert gpu.step_ms(model, batches, device, "fp32", steps=3, warmup=2, update=calls.append) >= 0
    assert calls == [batches] * 5


def test_the_in_process_captured_step_reports_an_eager_fallback(monkeypatch):
    from domaingen.run import compiled_step

    def refused(fn, **kwargs):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(torch, "compile", refused)  # the wrapper falls back to eager before the first step
    assert gpu.captured_inprocess_ms(torch.device("cpu"), "fp32", per_env=4, mode=compiled_step.INDUCTOR) == (
        "not available (--compile_step inductor fell back to eager; see the warning)")
