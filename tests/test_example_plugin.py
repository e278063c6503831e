"""The README's example plugin (tests/example_plugin): its loss, and 2-job sweeps with the parallel
launcher, loaded once by entry point and once by DOMAINGEN_PLUGINS, in fresh processes; then
relaunched, collected and evaluated in a shell that names no plugin at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from domaingen import plugins
from domaingen.plugins import load_plugin
from domaingen.run.rundir import RunDirectory
from domaingen.testing import build, separable_batches
from domaingen.run.training import TrainConfig, train

EXAMPLE_SRC = Path(__file__).parent / "example_plugin" / "src"
SPEC = """
algorithms = ["LabelSmoothing"]
datasets = ["ColoredMNIST"]
test_envs = [[2]]
n_hparams = 1
n_trials = 2
steps = 3
checkpoint_freq = 2

[hparams]
featurizer = "MLP"
mlp_width = 32
batch_size = 16
"""


@pytest.fixture(scope="module")
def label_smoothing():
    """The example plugin's module, imported as a plugin (registration stays for the session)."""
    if str(EXAMPLE_SRC) not in sys.path:
        sys.path.insert(0, str(EXAMPLE_SRC))
    load_plugin("domaingen_example_plugin")
    plugins.forget("domaingen_example_plugin")  # other tests' sweep jobs must not be asked to load it
    return sys.modules["domaingen_example_plugin"]


def test_the_pyproject_declares_the_entry_point():
    import tomllib

    project = tomllib.loads((EXAMPLE_SRC.parent / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["domaingen.plugins"] == {"label_smoothing": "domaingen_example_plugin"}


def test_loss_equals_torch_label_smoothing_with_many_logits(label_smoothing):
    algorithm = build("LabelSmoothing", (64,), num_classes=3, smoothing=0.15)
    logits = torch.randn(10, 3)
    y = torch.randint(0, 3, (10,))
    expected = F.cross_entropy(logits, y, label_smoothing=0.15)
    assert algorithm.smoothed_loss(logits, y).item() == pytest.approx(expected.item(), rel=1e-6)


def test_loss_with_one_logit_is_the_logistic_loss_of_smoothed_targets(label_smoothing):
    algorithm = build("LabelSmoothing", (2, 14, 14), num_classes=2, single_logit=True, smoothing=0.2)
    assert algorithm.classifier.out_features == 1
    logits = torch.randn(12, 1)
    y = torch.randint(0, 2, (12,))
    target = 0.8 * y.float() + 0.2 / 2
    expected = F.binary_cross_entropy_with_logits(logits[:, 0], target)
    assert algorithm.smoothed_loss(logits, y).item() == pytest.approx(expected.item(), rel=1e-6)
    losses = algorithm.update(separable_batches((2, 14, 14), n=8))  # the IndexError of the old README example
    assert set(losses) == {"loss", "nll"} and losses["loss"] > 0
    assert 0.5 <= algorithm.diagnostics()["label_smoothing_confidence"] <= 1.0


def test_trains_on_irm_colored_mnist_with_one_logit(label_smoothing, mnist_dir, tmp_path):
    outcome = train(TrainConfig(dataset="IRMColoredMNIST", algorithm="LabelSmoothing", output_dir=str(tmp_path / "run"),
                                test_envs=[2], data_dir=str(mnist_dir), steps=2, checkpoint_freq=1,
                                hparams={"mlp_width": 32}))
    assert outcome.state == "done"
    record = outcome.records[-1]
    assert record["hparams"]["single_logit"] is True and 0.5 <= record["label_smoothing_confidence"] <= 1.0


# --- fresh processes ------------------------------------------------------------------------------

def make_entry_point_site(root: Path) -> Path:
    """What `pip install` of tests/example_plugin leaves for importlib.metadata: a dist-info with the entry point."""
    site = root / "site"
    info = site / "domaingen_example_plugin-0.1.0.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: domaingen-example-plugin\nVersion: 0.1.0\n")
    info.joinpath("entry_points.txt").write_text("[domaingen.plugins]\nlabel_smoothing = domaingen_example_plugin\n")
    return site


def domaingen(cwd: Path, *argv: str, pythonpath: list[Path], **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DOMAINGEN_PLUGINS")}
    environment.update(PYTHONPATH=os.pathsep.join(map(str, pythonpath)), **env)
    return subprocess.run([sys.executable, "-m", "domaingen", "-q", *argv], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)


def launch_sweep(tmp_path: Path, pythonpath: list[Path], workers: int = 2, **env: str) -> Path:
    (tmp_path / "spec.toml").write_text(SPEC)
    done = domaingen(tmp_path, "sweep", "launch", "--spec", "spec.toml", "--output_dir", "sweep", "--data_dir",
                     "embedded", "--launcher", "parallel", "--workers", str(workers), "--yes", "--no_progress",
                     pythonpath=pythonpath, **env)
    assert done.returncode == 0, done.stderr
    assert "launched 2 jobs: 2 done" in done.stdout
    return tmp_path / "sweep"


def job_dirs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if (p / "args.json").exists())


def test_sweep_by_entry_point_then_relaunch_collect_evaluate_without_naming_it(tmp_path):
    sweep = launch_sweep(tmp_path, [make_entry_point_site(tmp_path), EXAMPLE_SRC])
    assert json.loads((sweep / "sweep.json").read_text())["plugins"] == ["domaingen_example_plugin"]
    jobs = job_dirs(sweep)
    assert len(jobs) == 2
    for job in jobs:
        assert json.loads((job / "args.json").read_text())["plugins"] == ["domaingen_example_plugin"]
        records = RunDirectory(job).records()
        assert [r["step"] for r in records] == [0, 2]
        assert all(0.5 <= r["label_smoothing_confidence"] <= 1.0 for r in records)
    # a fresh shell: the package importable, but no entry point, no DOMAINGEN_PLUGINS, no --plugins
    (jobs[0] / "done").unlink()
    relaunch = domaingen(tmp_path, "sweep", "launch", "--output_dir", "sweep", "--data_dir", "embedded",
                         "--launcher", "local", "--yes", "--no_progress", pythonpath=[EXAMPLE_SRC])
    assert relaunch.returncode == 0, relaunch.stderr
    assert "1 incomplete (to resume)" in relaunch.stdout and "launched 1 jobs: 1 done" in relaunch.stdout
    collected = domaingen(tmp_path, "collect", "--input_dir", "sweep", "--format", "csv", pythonpath=[EXAMPLE_SRC])
    assert collected.returncode == 0, collected.stderr
    assert "LabelSmoothing" in collected.stdout
    evaluated = domaingen(tmp_path, "evaluate", str(jobs[1]), pythonpath=[EXAMPLE_SRC])
    assert evaluated.returncode == 0, evaluated.stderr
    assert "equal to the record of step" in evaluated.stdout


def test_sweep_by_environment_variable(tmp_path):
    sweep = launch_sweep(tmp_path, [EXAMPLE_SRC], workers=1, DOMAINGEN_PLUGINS="domaingen_example_plugin")
    assert json.loads((sweep / "sweep.json").read_text())["plugins"] == ["domaingen_example_plugin"]
    jobs = job_dirs(sweep)
    assert len(jobs) == 2
    for job in jobs:
        assert RunDirectory(job).state() == "done"
        assert json.loads((job / "args.json").read_text())["plugins"] == ["domaingen_example_plugin"]
        assert all(0.5 <= r["label_smoothing_confidence"] <= 1.0 for r in RunDirectory(job).records())


def test_pytest_pyargs_domaingen_testing_checks_the_plugin(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DOMAINGEN_CHECK_ALGORITHMS")}
    environment.update(PYTHONPATH=str(EXAMPLE_SRC), DOMAINGEN_PLUGINS="domaingen_example_plugin")
    # two of the checks keep this fast; the suite runs all of them on LabelSmoothing in-process
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
                           "domaingen.testing", "-k", "equal_seeds or builds_updates_and_predicts and 64"],
                          cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:]
    # LabelSmoothing and its compositions (+EMA, +ModReg, +SWAD), 2 checks each
    assert "8 passed" in done.stdout
    assert "test_generic_check[LabelSmoothing-" in subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "--pyargs",
         "domaingen.testing"], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600).stdout
