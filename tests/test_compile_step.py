"""--compile_step: compiled updates equal eager ones, compile once, fall back with one warning, refuse bad values.

The tests marked `compile` run inductor (a C++ compiler on the CPU; 5-20 s each, less with a warm
inductor cache); `-m "not compile"` leaves them out.
"""

from __future__ import annotations

import logging
import shutil
import sys

import pytest
import torch
import torch._dynamo.utils

from conftest import FAST_HPARAMS
from domaingen.algorithms import ALGORITHMS
from domaingen.algorithms.base import UNCHECKED_STEP, eager_step_reason
from domaingen.cli.main import main
from domaingen.datasets import DATASETS
from domaingen.datasets.environment import Environment
from domaingen.datasets.sampling import MinibatchSampler
from domaingen.datasets.splits import Split
from domaingen.errors import DomaingenError
from domaingen.hparams import draw_hparams
from domaingen.run.compiled_step import CompiledUpdate, step_update
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, resolve, train
from domaingen.testing import VOLATILE_FIELDS

FALLBACK = "torch.compile failed for the training step"
CPU = torch.device("cpu")

needs_compiler = pytest.mark.skipif(
    sys.platform != "linux" or not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
    reason="inductor compiles CPU graphs with a C++ compiler; none is installed here (or not Linux)",
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA graphs need a CUDA device; this machine has none")


def compiled_graphs() -> int:
    """How many distinct graphs torch.compile has captured in this process so far."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _algorithm(name: str, **extra):
    space = {**DATASETS.get("ColoredMNIST").hparam_space(), **ALGORITHMS.get(name).hparam_space()}
    hparams = {**draw_hparams(space, "ColoredMNIST", 0), **FAST_HPARAMS, **extra}
    torch.manual_seed(0)
    return ALGORITHMS.get(name)((2, 28, 28), 2, 2, hparams)


def _sampler(device: torch.device = CPU) -> MinibatchSampler:
    """Batches of 16 from splits of 37 and 41 examples: no size divides into the other."""
    g = torch.Generator().manual_seed(3)
    envs = [Environment(f"e{n}", torch.randint(256, (n, 2, 28, 28), generator=g, dtype=torch.uint8),
                        torch.randint(2, (n,), generator=g)) for n in (37, 41)]
    splits = [Split(env, torch.arange(len(env.y))) for env in envs]
    return MinibatchSampler(splits, 16, seed=5, device=device)


def _train(algorithm, update, steps: int, device: torch.device = CPU) -> list[dict]:
    sampler = _sampler(device)
    return [dict(update(sampler.next())) for _ in range(steps)]


def _assert_same_weights(a, b, atol: float) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        gap = (x.float() - y.float()).abs().max().item() if x.numel() else 0.0
        assert gap <= atol, f"{name}: largest difference {gap:.3g} > {atol:g}"


# ---- inductor on the CPU (compiles)


@pytest.mark.compile
@needs_compiler
@pytest.mark.parametrize("name", ["ERM", "CORAL"])
def test_inductor_updates_equal_eager_updates_and_compile_once(name, caplog):
    eager = _algorithm(name)
    eager_losses = _train(eager, eager.update, 5)
    model = _algorithm(name)
    update = step_update(model.update, model, "inductor", CPU)
    assert isinstance(update, CompiledUpdate)
    sampler, graphs = _sampler(), [compiled_graphs()]
    with caplog.at_level(logging.WARNING):
        losses = []
        for _ in range(5):
            losses.append(dict(update(sampler.next())))
            graphs.append(compiled_graphs())
    assert not [r for r in caplog.records if FALLBACK in r.getMessage()]
    assert update.compiled is not None and graphs[1] > graphs[0]  # the first step compiled
    assert graphs[2:] == [graphs[2]] * 4  # from the third step on nothing compiles again
    _assert_same_weights(model, eager, atol=1e-5)
    for mine, theirs in zip(losses, eager_losses):
        assert mine.keys() == theirs.keys()
        assert all(abs(mine[k] - theirs[k]) < 1e-5 for k in mine)


@pytest.mark.compile
@needs_compiler
def test_a_run_with_compile_step_records_it_and_the_eager_losses_and_weights(tmp_path, caplog):
    common = dict(dataset="ColoredMNIST", algorithm="ERM", test_envs=[2], data_dir="embedded",
                  hparams=dict(FAST_HPARAMS), steps=4, checkpoint_freq=3)
    train(TrainConfig(output_dir=str(tmp_path / "eager"), **common))
    graphs = compiled_graphs()
    with caplog.at_level(logging.WARNING):
        train(TrainConfig(output_dir=str(tmp_path / "compiled"), compile_step="inductor", **common))
    # the losses below come from compiled graphs, not from a silent fallback to eager
    assert not [r for r in caplog.records if FALLBACK in r.getMessage()] and compiled_graphs() > graphs
    eager, compiled = (RunDirectory(tmp_path / d) for d in ("eager", "compiled"))
    assert [r["args"]["compile_step"] for r in compiled.records()] == ["inductor", "inductor"]
    assert [r["args"]["compile_step"] for r in eager.records()] == ["off", "off"]
    for mine, theirs in zip(compiled.records(), eager.records()):
        assert abs(mine["loss"] - theirs["loss"]) < 1e-5
    weights = compiled.load_checkpoint()["algorithm"]["model"]
    for key, value in eager.load_checkpoint()["algorithm"]["model"].items():
        assert torch.allclose(weights[key].float(), value.float(), atol=1e-5, rtol=0), key


# ---- fallbacks (no compilation)


def test_a_compile_that_fails_at_once_warns_once_and_trains_eagerly(monkeypatch, caplog):
    def refused(fn, **kwargs):
        raise RuntimeError("torch.compile is not supported on this Python\nmore detail")

    monkeypatch.setattr(torch, "compile", refused)
    eager = _algorithm("ERM")
    eager_losses = _train(eager, eager.update, 3)
    model = _algorithm("ERM")
    with caplog.at_level(logging.WARNING):
        losses = _train(model, step_update(model.update, model, "inductor", CPU), 3)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "torch.compile failed for the training step (RuntimeError: torch.compile is not supported on this Python); "
        "training without it"]
    assert losses == eager_losses
    _assert_same_weights(model, eager, atol=0)


def test_a_compile_that_fails_midway_restores_the_step_and_warns_once(monkeypatch, caplog):
    """The failed call has already stepped the model, Adam and the dropout generator; the eager
    update that replaces it starts from the state before it, so the run equals an eager one."""
    calls = []

    def broken_compile(fn, **kwargs):
        def fails_after_stepping(minibatches):
            calls.append(1)
            fn(minibatches)
            raise RuntimeError("InductorError: no working C++ compiler found")
        return fails_after_stepping

    monkeypatch.setattr(torch, "compile", broken_compile)
    eager = _algorithm("ERM", mlp_dropout=0.5)
    eager_losses = _train(eager, eager.update, 3)
    model = _algorithm("ERM", mlp_dropout=0.5)
    with caplog.at_level(logging.WARNING):
        losses = _train(model, step_update(model.update, model, "inductor", CPU), 3)
    assert len(calls) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "torch.compile failed for the training step (RuntimeError: InductorError: no working C++ compiler found); "
        "training without it"]
    assert losses == eager_losses
    _assert_same_weights(model, eager, atol=0)
    assert torch.equal(model.optimizer.state_dict()["state"][0]["exp_avg"],
                       eager.optimizer.state_dict()["state"][0]["exp_avg"])


def test_torchs_notices_about_the_updates_designed_graph_breaks_are_dropped_and_others_kept(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    model = _algorithm("ERM")
    step_update(model.update, model, "inductor", CPU)
    logger = logging.getLogger("torch._dynamo.variables.tensor")

    def kept(message: str) -> bool:
        return all(f.filter(logging.LogRecord(logger.name, logging.WARNING, "", 0, message, (), None))
                   for f in logger.filters)

    assert not kept("Graph break from `Tensor.item()`, consider setting:\n    torch._dynamo.config...")
    assert kept("Graph break: something unexpected")


def test_an_algorithm_not_declared_static_trains_eagerly_with_one_warning_naming_why(monkeypatch, caplog):
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("torch.compile called for an eager update"))
    model = _algorithm("IRM")
    with caplog.at_level(logging.WARNING):
        update = step_update(model.update, model, "inductor", CPU)
    assert update == model.update
    assert [r.getMessage() for r in caplog.records] == [
        "--compile_step inductor: IRM trains eagerly: its penalty is a gradient that the loss differentiates again "
        "(double backward), which torch.compile does not support"]
    # a modifier that overrides update is eager until it says otherwise, though ERM is not
    assert eager_step_reason(ALGORITHMS.get("ERM")) == ""
    assert eager_step_reason(ALGORITHMS.get("ERM+EMA")) == UNCHECKED_STEP
    # and a subclass may refuse the update it inherits: MMD's from the class it shares with CORAL
    assert eager_step_reason(ALGORITHMS.get("CORAL")) == ""
    assert eager_step_reason(ALGORITHMS.get("MMD")).startswith("its widest Gaussian kernels (g = 1000) amplify")


def test_cudagraphs_without_cuda_warns_and_runs_eagerly_with_the_eager_records(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("torch.compile called without CUDA"))
    common = dict(dataset="ColoredMNIST", algorithm="ERM", test_envs=[2], data_dir="embedded",
                  hparams=dict(FAST_HPARAMS), steps=4, checkpoint_freq=3, device="cpu")
    train(TrainConfig(output_dir=str(tmp_path / "eager"), **common))
    with caplog.at_level(logging.WARNING):
        train(TrainConfig(output_dir=str(tmp_path / "graphs"), compile_step="cudagraphs", **common))
    assert [r.getMessage() for r in caplog.records if "compile_step" in r.getMessage()] == [
        "--compile_step cudagraphs records CUDA graphs, which need a CUDA device, but this run trains on cpu; "
        "training eagerly"]
    eager, graphs = RunDirectory(tmp_path / "eager").records(), RunDirectory(tmp_path / "graphs").records()
    assert [r["args"]["compile_step"] for r in graphs] == ["cudagraphs", "cudagraphs"]
    varying = VOLATILE_FIELDS
    assert [{k: v for k, v in r.items() if k not in varying} for r in graphs] == \
        [{k: v for k, v in r.items() if k not in varying} for r in eager]


# ---- bad values


def test_an_unknown_compile_step_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--data_dir", "embedded",
                 "--output_dir", str(out), "--compile_step", "max-autotune"])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert err.strip() == ("domaingen train: error: argument --compile_step: expected one of off, inductor, "
                           "cudagraphs, got 'max-autotune'")
    with pytest.raises(DomaingenError, match=r"^compile_step must be one of off, inductor, cudagraphs, got 'on' "
                                             r"\(TrainConfig\)$"):
        resolve(TrainConfig(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(out), compile_step="on"))


def test_compile_step_is_not_part_of_the_run_identity(tmp_path):
    config = dict(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(tmp_path), data_dir="embedded")
    assert resolve(TrainConfig(**config, compile_step="cudagraphs")).identity() == \
        resolve(TrainConfig(**config)).identity()


def test_a_sweep_takes_compile_step_without_changing_job_ids_or_its_spec(tmp_path):
    from domaingen.sweep.spec import build_jobs, parse_spec, prepare_sweep_dir, read_recorded_spec, train_command

    base = {"algorithms": ["ERM"], "datasets": ["ColoredMNIST"], "test_envs": [[2]], "n_hparams": 1, "n_trials": 1}
    eager, graphs = parse_spec(base), parse_spec({**base, "compile_step": "cudagraphs"})
    assert [j.job_id for j in build_jobs(graphs)] == [j.job_id for j in build_jobs(eager)]
    assert "--compile_step" not in train_command(build_jobs(eager)[0], tmp_path, "embedded")
    assert train_command(build_jobs(graphs)[0], tmp_path, "embedded").split("--compile_step ")[1][:10] == "cudagraphs"
    # a sweep launched eagerly is relaunched with CUDA graphs (and back) as the same sweep
    prepare_sweep_dir(tmp_path / "sweep", eager)
    prepare_sweep_dir(tmp_path / "sweep", graphs)
    assert read_recorded_spec(tmp_path / "sweep")["compile_step"] == "cudagraphs"
    prepare_sweep_dir(tmp_path / "sweep", eager)
    assert read_recorded_spec(tmp_path / "sweep")["compile_step"] is None


# ---- CUDA graphs (a CUDA device)


@pytest.fixture
def full_fp32_kernels():
    """Full-fp32, deterministic cuDNN and cuBLAS for one test, restored after it.

    PyTorch lets cuDNN's convolutions use TF32 by default, and cuDNN may pick a different algorithm for
    the captured graph than for the eager step: on an H100 (torch 2.11) the two paths' first-layer
    weights then parted by more than 1e-4 after 5 steps. This test checks what the capture replays
    (the same inputs, the same optimizer state), not the kernels' precision, so it fixes the kernels.
    """
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
     torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) = saved


@pytest.mark.compile
@needs_cuda
def test_cudagraph_updates_equal_eager_updates_on_cuda(caplog, full_fp32_kernels):
    cuda = torch.device("cuda")
    eager = _algorithm("ERM", featurizer="MNIST_CNN").to(cuda, memory_format=torch.channels_last)
    eager_losses = _train(eager, eager.update, 5, cuda)
    model = _algorithm("ERM", featurizer="MNIST_CNN").to(cuda, memory_format=torch.channels_last)
    skipped = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    with caplog.at_level(logging.WARNING):
        update = step_update(model.update, model, "cudagraphs", cuda)
        losses = _train(model, update, 5, cuda)
    assert isinstance(update, CompiledUpdate) and update.compiled is not None
    assert not [r for r in caplog.records if FALLBACK in r.getMessage()]
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == skipped  # every graph was recorded
    _assert_same_weights(model, eager, atol=1e-4)
    assert all(abs(a["loss"] - b["loss"]) < 1e-4 for a, b in zip(losses, eager_losses))


# ---- the benchmark section


def test_bench_compile_prints_eager_compiled_and_their_ratio(monkeypatch):
    from domaingen.bench import compiled as bench

    def refused(fn, **kwargs):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(torch, "compile", refused)
    clock = iter(range(1000))  # every step takes one second of wall time and of CPU time
    monkeypatch.setattr(bench.time, "perf_counter", lambda: float(next(clock)))
    cpu_clock = iter(range(1000))
    monkeypatch.setattr(bench.time, "process_time", lambda: float(next(cpu_clock)))
    rows = bench.bench_compiled_step(2, settings=["MLP"])
    label = "ERM step, MLP, fp32, 64 per env x 2 envs"
    assert [r[0] for r in rows] == [f"{label}, eager", f"{label}, --compile_step inductor", f"{label}, inductor / eager"]
    assert rows[1][1] == "1000.00 ms (fell back to eager (see the warning))"
    assert rows[2][1] == "1.00x (CPU time 1.00x)"
