"""--compile_eval: evaluation through torch.compile gives the eager predictions, pads to one shape, falls back."""

from __future__ import annotations

import logging
import shutil
import sys

import pytest
import torch
import torch._dynamo.utils

from conftest import FAST_HPARAMS
from domaingen.algorithms import ALGORITHMS
from domaingen.cli.main import main
from domaingen.errors import DomaingenError
from domaingen.run.evaluation import CompiledPredict
from domaingen.hparams import draw_hparams
from domaingen.datasets import DATASETS
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, resolve, train

ACCURACY_KEYS = [f"env{i}_{s}_acc" for i in range(3) for s in ("in", "out")]
FALLBACK = "torch.compile failed for evaluation"

# Inductor compiles CPU graphs with a C++ compiler; where one is installed, compilation must work,
# and a silent fallback to eager evaluation is a failure of the feature under test.
needs_compiler = pytest.mark.skipif(
    sys.platform != "linux" or not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
    reason="torch.compile is expected to work only where a C++ compiler is installed (Linux)",
)


def compiled_graphs() -> int:
    """How many distinct graphs torch.compile has captured in this process so far."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _erm_mlp():
    space = {**DATASETS.get("ColoredMNIST").hparam_space(), **ALGORITHMS.get("ERM").hparam_space()}
    hparams = {**draw_hparams(space, "ColoredMNIST", 0), **FAST_HPARAMS}
    torch.manual_seed(0)
    model = ALGORITHMS.get("ERM")((2, 28, 28), 2, 2, hparams)
    return model.eval()


@needs_compiler
def test_compiled_logits_equal_eager_logits_for_every_batch_length(caplog):
    model = _erm_mlp()
    predict = CompiledPredict(model, batch_size=8)
    x = torch.rand(19, 2, 28, 28)
    graphs = compiled_graphs()
    with caplog.at_level(logging.WARNING), torch.inference_mode():
        for n in (3, 8, 19):  # shorter than, equal to and longer than the compiled batch
            assert torch.allclose(predict(x[:n]), model.predict(x[:n]), atol=1e-5, rtol=1e-5)
    # the compiled path was taken: no fallback to eager, and dynamo captured a graph
    assert predict.compiled is not None
    assert not [r for r in caplog.records if FALLBACK in r.getMessage()]
    assert compiled_graphs() > graphs


def test_every_call_reaches_the_compiled_graph_with_one_shape(monkeypatch):
    seen = []

    def fake_compile(fn, dynamic=None):
        def recorded(x):
            seen.append((tuple(x.shape), x.is_contiguous(memory_format=torch.channels_last)))
            return fn(x)
        return recorded

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = _erm_mlp()
    predict = CompiledPredict(model, batch_size=8)
    x = torch.rand(21, 2, 28, 28).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        out = predict(x)
    assert out.shape == (21, 2)
    assert torch.allclose(out, model.predict(x), atol=1e-6)
    # 21 = 8 + 8 + 5: the last part is padded to 8 and keeps the channels-last layout
    assert seen == [((8, 2, 28, 28), True)] * 3


def test_a_failing_compiler_warns_once_and_evaluates_eagerly(monkeypatch, caplog):
    calls = []

    def broken_compile(fn, dynamic=None):
        def fails(x):
            calls.append(1)
            raise RuntimeError("InductorError: no working C++ compiler found")
        return fails

    monkeypatch.setattr(torch, "compile", broken_compile)
    model = _erm_mlp()
    predict = CompiledPredict(model, batch_size=8)
    x = torch.rand(5, 2, 28, 28)
    with caplog.at_level(logging.WARNING), torch.inference_mode():
        first, second = predict(x), predict(x)
    assert torch.equal(first, model.predict(x)) and torch.equal(second, first)
    assert len(calls) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["torch.compile failed for evaluation (RuntimeError: InductorError: no working C++ "
                        "compiler found); evaluating without it"]


def _config(out, **kw) -> TrainConfig:
    return TrainConfig(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(out), test_envs=[2],
                       data_dir="embedded", hparams=dict(FAST_HPARAMS), steps=4, checkpoint_freq=3, **kw)


@needs_compiler
def test_a_compiled_run_records_the_eager_accuracies(tmp_path, caplog):
    # every split at every checkpoint, so that every accuracy is compared
    train(_config(tmp_path / "eager", compile_eval=False, eval_splits="all"))
    graphs = compiled_graphs()
    with caplog.at_level(logging.WARNING):
        train(_config(tmp_path / "compiled", compile_eval=True, eval_splits="all"))
    # the accuracies below come from the compiled graph, not from a silent fallback to eager
    assert not [r for r in caplog.records if FALLBACK in r.getMessage()]
    assert compiled_graphs() > graphs
    eager = RunDirectory(tmp_path / "eager").records()
    compiled = RunDirectory(tmp_path / "compiled").records()
    assert [r["step"] for r in compiled] == [0, 3]
    assert compiled[-1]["args"]["compile_eval"] is True
    for mine, reference in zip(compiled, eager):
        assert [mine[k] for k in ACCURACY_KEYS] == [reference[k] for k in ACCURACY_KEYS]


def test_compile_eval_is_not_part_of_the_run_identity(tmp_path):
    assert resolve(_config(tmp_path, compile_eval=True)).identity() == resolve(_config(tmp_path, compile_eval=False)).identity()


def test_environment_variable_sets_the_default_and_the_flag_overrides_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DOMAINGEN_COMPILE_EVAL", "1")
    assert resolve(_config(tmp_path)).args["compile_eval"] is True
    assert resolve(_config(tmp_path, compile_eval=False)).args["compile_eval"] is False
    monkeypatch.setenv("DOMAINGEN_COMPILE_EVAL", "0")
    assert resolve(_config(tmp_path)).args["compile_eval"] is False


def test_a_malformed_environment_variable_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DOMAINGEN_COMPILE_EVAL", "sometimes")
    with pytest.raises(DomaingenError, match=r"DOMAINGEN_COMPILE_EVAL must be 1 or 0 \(or true/false\), got 'sometimes'"):
        resolve(_config(tmp_path))
    code = main(["train", "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--data_dir", "embedded",
                 "--output_dir", str(tmp_path / "run"), "--steps", "1"])
    assert code == 2
    assert "domaingen: error: DOMAINGEN_COMPILE_EVAL must be 1 or 0 (or true/false), got 'sometimes'" in capsys.readouterr().err
