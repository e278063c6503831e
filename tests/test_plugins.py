"""Plugins: loading (entry points, DOMAINGEN_PLUGINS, --plugins), recording, bad input, the contract of update()."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import FAST_HPARAMS
from domaingen import plugins
from domaingen.algorithms import ALGORITHMS
from domaingen.cli.main import main
from domaingen.datasets import DATASETS
from domaingen.sweep.launch import launch
from domaingen.sweep.workers import LaunchOptions, run_job
from domaingen.networks import FEATURIZERS, build_featurizer
from domaingen.run.rundir import RunDirectory
from domaingen.sweep.spec import SweepSpec, build_jobs, parse_spec, prepare_sweep_dir, read_recorded_spec, train_command
from domaingen.run.training import TrainConfig, train

EXAMPLE_SRC = Path(__file__).parent / "example_plugin" / "src"
FAST = json.dumps(FAST_HPARAMS)


@pytest.fixture
def make_plugin(tmp_path, monkeypatch):
    """Write plugin modules into tmp_path; everything they register or load is undone afterwards."""
    monkeypatch.chdir(tmp_path)
    before = {table.kind: set(table.names()) for table in (ALGORITHMS, DATASETS, FEATURIZERS)}
    loaded_before = set(plugins.loaded_plugins())
    written: list[str] = []

    def write(name: str, body: str) -> Path:
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(body))
        written.append(name)
        return path

    yield write
    for table in (ALGORITHMS, DATASETS, FEATURIZERS):
        for name in set(table.names()) - before[table.kind]:
            table.unregister(name)
    for spec in set(plugins.loaded_plugins()) - loaded_before:
        plugins.forget(spec)
    for name in written:
        plugins.forget(name)
        sys.modules.pop(name, None)


ALGORITHM_PLUGIN = """
    from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, classification_loss, concat

    @ALGORITHMS.register("{name}")
    class Plugged(FeaturizerClassifier):
        \"\"\"ERM, from a plugin.\"\"\"

        def update(self, minibatches):
            x, y = concat(minibatches)
            loss = classification_loss(self.predict(x), y)
            self.step(loss)
            return {returns}
"""


def algorithm_plugin(make_plugin, module: str, name: str, returns: str = '{"loss": loss.item()}') -> Path:
    return make_plugin(module, ALGORITHM_PLUGIN.format(name=name, returns=returns))


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def train_args(out: Path, algorithm: str, *extra: str) -> list[str]:
    return ["train", "--dataset", "ColoredMNIST", "--algorithm", algorithm, "--test_envs", "2", "--data_dir",
            "embedded", "--steps", "3", "--checkpoint_freq", "2", "--hparams", FAST, "--output_dir", str(out), *extra]


# --- loading -------------------------------------------------------------------------------------

def test_a_module_name_loads_once_and_is_recorded(make_plugin):
    algorithm_plugin(make_plugin, "my_algs", "Plugged")
    assert plugins.load_plugin("my_algs") == str(Path("my_algs.py").resolve())  # found in the current directory
    cls = ALGORITHMS.get("Plugged")
    assert plugins.load_plugin("my_algs") == str(Path("my_algs.py").resolve())  # idempotent: not imported again
    assert ALGORITHMS.get("Plugged") is cls and ALGORITHMS.owners()["Plugged"] == "my_algs"
    assert str(Path("my_algs.py").resolve()) in plugins.loaded_plugins()


def test_a_path_loads_and_is_recorded_absolute(make_plugin, tmp_path):
    path = algorithm_plugin(make_plugin, "path_algs", "ByPath")
    assert plugins.load_plugins(["./path_algs.py"])[-1] == str(path.resolve())
    assert ALGORITHMS.owners()["ByPath"] == "path_algs"


def test_environment_variable_and_commas(make_plugin, monkeypatch):
    algorithm_plugin(make_plugin, "env_a", "EnvA")
    algorithm_plugin(make_plugin, "env_b", "EnvB")
    monkeypatch.setenv("DOMAINGEN_PLUGINS", " env_a.py , env_b.py ")
    plugins.load_plugins()
    assert {"EnvA", "EnvB"} <= set(ALGORITHMS.names())


def test_entry_points_are_found_through_importlib_metadata(tmp_path, monkeypatch):
    site = make_entry_point_site(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(EXAMPLE_SRC))
    assert plugins.load_entry_points() == ["domaingen_example_plugin"]
    assert ALGORITHMS.owners()["LabelSmoothing"] == "domaingen_example_plugin"
    plugins.forget("domaingen_example_plugin")  # other tests' jobs must not be asked to load it


def make_entry_point_site(root: Path) -> Path:
    """A folder that importlib.metadata reads as an installed distribution with the example's entry point."""
    site = root / "site"
    info = site / "domaingen_example_plugin-0.1.0.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: domaingen-example-plugin\nVersion: 0.1.0\n")
    info.joinpath("entry_points.txt").write_text("[domaingen.plugins]\nlabel_smoothing = domaingen_example_plugin\n")
    return site


def test_a_plugin_registers_a_featurizer(make_plugin):
    make_plugin("my_nets", """
        from torch import nn
        from domaingen.networks import FEATURIZERS

        @FEATURIZERS.register("Tiny")
        class Tiny(nn.Module):
            def __init__(self, input_shape, hparams):
                super().__init__()
                self.n_outputs = int(hparams.get("tiny_width", 5))
                self.net = nn.Sequential(nn.Flatten(), nn.LazyLinear(self.n_outputs))
            def forward(self, x):
                return self.net(x)
    """)
    plugins.load_plugin("my_nets")
    net = build_featurizer((2, 14, 14), {"featurizer": "Tiny"})
    assert net(torch.zeros(3, 2, 14, 14)).shape == (3, 5)


# --- bad input: one line, exit 2, nothing run ------------------------------------------------------

def assert_one_line_exit_2(code: int, out: str, err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("domaingen: error: plugin") or lines[0].startswith("domaingen: error: entry point")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in err


def test_missing_module_is_one_line_and_nothing_runs(make_plugin, tmp_path, capsys):
    code, out, err = run_cli(capsys, "--plugins", "no_such_mod", *train_args(tmp_path / "run", "ERM"))
    assert_one_line_exit_2(code, out, err, "plugin no_such_mod: no module named 'no_such_mod'")
    assert not (tmp_path / "run").exists()


def test_missing_path_is_one_line(make_plugin, tmp_path, capsys):
    code, out, err = run_cli(capsys, "list", "--plugins", "plugins/absent.py")
    assert_one_line_exit_2(code, out, err, "plugin plugins/absent.py: no such file", str(tmp_path / "plugins/absent.py"))


def test_a_plugin_whose_import_fails_is_named_with_its_error(make_plugin, tmp_path, capsys):
    make_plugin("broken", "import numpy\nraise RuntimeError('half-written plugin')\n")
    code, out, err = run_cli(capsys, *train_args(tmp_path / "run", "ERM"), "--plugins=broken.py")
    assert_one_line_exit_2(code, out, err, "plugin broken.py failed to import: RuntimeError: half-written plugin")
    assert not (tmp_path / "run").exists()
    make_plugin("needs_dep", "import a_package_nobody_installed\n")
    code, out, err = run_cli(capsys, "list", "--plugins", "needs_dep")
    assert_one_line_exit_2(code, out, err, "plugin needs_dep failed to import: ModuleNotFoundError",
                           "a_package_nobody_installed")


def test_a_name_clash_with_a_builtin_names_both_owners(make_plugin, capsys):
    algorithm_plugin(make_plugin, "clash", "ERM")
    code, out, err = run_cli(capsys, "--plugins", "clash", "list")
    assert_one_line_exit_2(code, out, err, "plugin clash failed to import",
                           "algorithm 'ERM' is registered twice: by domaingen.algorithms.erm (built in) and by clash")
    assert ALGORITHMS.owners()["ERM"] == "domaingen.algorithms.erm (built in)"


def test_a_name_clash_between_two_plugins_names_both(make_plugin, capsys):
    algorithm_plugin(make_plugin, "first_plugin", "Twin")
    algorithm_plugin(make_plugin, "second_plugin", "Twin")
    code, out, err = run_cli(capsys, "list", "--plugins", "first_plugin,second_plugin")
    assert_one_line_exit_2(code, out, err, "plugin second_plugin failed to import",
                           "algorithm 'Twin' is registered twice: by first_plugin and by second_plugin")


# --- the CLI: every command sees them, runs record them ---------------------------------------------

@pytest.mark.fast
def test_list_and_train_see_a_plugin_anywhere_on_the_line(make_plugin, tmp_path, capsys):
    algorithm_plugin(make_plugin, "cli_algs", "CliAlg")
    code, out, _ = run_cli(capsys, "--plugins", "cli_algs", "list")
    assert code == 0 and "CliAlg" in out and "ERM, from a plugin." in out
    assert "Plugins loaded:" in out and "cli_algs" in out
    code, out, _ = run_cli(capsys, *train_args(tmp_path / "run", "CliAlg"), "--plugins", "cli_algs")
    assert code == 0 and "done" in out
    args = json.loads((tmp_path / "run" / "args.json").read_text())
    assert args["plugins"] == [str((tmp_path / "cli_algs.py").resolve())]
    records = RunDirectory(tmp_path / "run").records()
    assert records[-1]["args"]["plugins"] == args["plugins"]


def test_evaluate_loads_the_recorded_plugin_without_the_flag(make_plugin, tmp_path, capsys):
    algorithm_plugin(make_plugin, "eval_algs", "EvalAlg")
    assert run_cli(capsys, *train_args(tmp_path / "run", "EvalAlg"), "--plugins", "eval_algs.py")[0] == 0
    # a fresh process: the module, its registration and the loader's memory are gone
    ALGORITHMS.unregister("EvalAlg")
    plugins.forget("eval_algs.py")
    sys.modules.pop("eval_algs")
    code, out, err = run_cli(capsys, "evaluate", str(tmp_path / "run"))
    assert code == 0, err
    assert "EvalAlg on ColoredMNIST" in out and "equal to the record of step" in out


def test_update_without_a_loss_fails_the_run_with_its_reason(make_plugin, tmp_path, capsys):
    algorithm_plugin(make_plugin, "no_loss", "NoLoss", returns="None")
    code, _, err = run_cli(capsys, *train_args(tmp_path / "run", "NoLoss"), "--plugins", "no_loss")
    reason = (tmp_path / "run" / "failed").read_text().strip()
    assert code == 2 and RunDirectory(tmp_path / "run").state() == "failed"
    assert reason == ("UpdateContractError: NoLoss.update() returned None at step 0; "
                      "it must return a dict of scalar losses with a 'loss'")
    assert err.strip().splitlines()[-1] == "domaingen: error: " + reason.removeprefix("UpdateContractError: ")


@pytest.mark.parametrize("returns, reason", [
    ('{"nll": loss.item()}', "NoLossKey.update() returned a dict without 'loss' (keys: nll) at step 0"),
    ('{"loss": float("nan")}', "DivergedError: non-finite loss at step 0: {'loss': nan}"),
    ('{"loss": loss}', ""),  # a one-element tensor is a scalar: accepted as its float
])
def test_update_contract_is_checked(make_plugin, tmp_path, returns, reason):
    algorithm_plugin(make_plugin, "contract", "NoLossKey", returns=returns)
    plugins.load_plugin("contract")
    config = TrainConfig(dataset="ColoredMNIST", algorithm="NoLossKey", output_dir=str(tmp_path / "run"),
                         test_envs=[2], data_dir="embedded", hparams=FAST_HPARAMS, steps=3, checkpoint_freq=2)
    if not reason:
        assert train(config).state == "done"
        assert all(isinstance(r["loss"], float) and math.isfinite(r["loss"]) for r in RunDirectory(config.output_dir).records())
        return
    with pytest.raises(Exception):
        train(config)
    assert reason in (tmp_path / "run" / "failed").read_text()


# --- sweeps: the spec records them, jobs load them -------------------------------------------------

def test_a_spec_names_plugins_and_jobs_carry_them(make_plugin, tmp_path):
    path = algorithm_plugin(make_plugin, "spec_algs", "SpecAlg")
    spec = parse_spec({"algorithms": ["SpecAlg"], "datasets": ["ColoredMNIST"], "test_envs": [[2]], "n_hparams": 1,
                       "n_trials": 1, "steps": 3, "plugins": ["spec_algs.py"]})
    job = build_jobs(spec)[0]
    assert job.args["plugins"] == ["spec_algs.py"]
    unplugged = build_jobs(SweepSpec(**{**spec.canonical(), "plugins": []}))[0]
    assert job.job_id == unplugged.job_id  # plugins are not part of a job's identity
    assert train_command(job, tmp_path / "sweep", "embedded").endswith("--plugins spec_algs.py")
    assert path.exists()


def test_recorded_spec_keeps_every_plugin_and_ignores_them_when_comparing(make_plugin, tmp_path):
    base = {"algorithms": ["ERM"], "datasets": ["ColoredMNIST"], "n_hparams": 1, "n_trials": 1}
    prepare_sweep_dir(tmp_path / "sweep", SweepSpec(**base, plugins=["a_mod"]))
    prepare_sweep_dir(tmp_path / "sweep", SweepSpec(**base, plugins=["b_mod"]))  # not "a different spec"
    assert read_recorded_spec(tmp_path / "sweep")["plugins"] == ["a_mod", "b_mod"]


def test_a_job_whose_plugin_cannot_be_imported_fails_and_the_sweep_goes_on(make_plugin, tmp_path):
    algorithm_plugin(make_plugin, "good_algs", "GoodAlg")
    spec = parse_spec({"algorithms": ["GoodAlg"], "datasets": ["ColoredMNIST"], "test_envs": [[2]], "n_hparams": 1,
                       "n_trials": 2, "steps": 2, "checkpoint_freq": 1, "hparams": FAST_HPARAMS,
                       "plugins": ["good_algs.py"]})
    good, bad = build_jobs(spec)
    bad = type(bad)(bad.job_id, {**bad.args, "plugins": ["good_algs.py", "vanished_algs"]})
    results = {r.job_id: r for r in launch([bad, good], str(tmp_path / "sweep"), "embedded", "local",
                                           LaunchOptions(progress=False))}
    message = ("plugin vanished_algs: no module named 'vanished_algs' (not on sys.path, PYTHONPATH or in "
               f"{tmp_path}); give its module name or the path to its .py file")
    assert results[bad.job_id].state == "failed" and results[bad.job_id].message == message
    assert (tmp_path / "sweep" / bad.job_id / "failed").read_text().strip() == message
    assert results[good.job_id].state == "done"
    direct = run_job(bad.job_id, dataclasses.asdict(bad.config(tmp_path / "again", "embedded")))
    assert direct.state == "failed" and direct.message == message


def test_a_broken_entry_point_names_its_package(tmp_path, monkeypatch, capsys):
    info = tmp_path / "site" / "domaingen_broken-1.0.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: domaingen-broken\nVersion: 1.0\n")
    info.joinpath("entry_points.txt").write_text("[domaingen.plugins]\nbroken = no_such_plugin_mod\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "list")
    assert_one_line_exit_2(code, out, err, "entry point 'broken' of domaingen-broken: plugin no_such_plugin_mod: "
                                           "no module named 'no_such_plugin_mod'")


@pytest.mark.parametrize("entry", ["slurm", "ray"])
def test_slurm_and_ray_job_bodies_load_the_jobs_plugins(make_plugin, tmp_path, monkeypatch, entry):
    """What a Slurm job (submitit's pickled callable) and a Ray task run in their own processes."""
    from domaingen.sweep.slurm import _RequeueableChunk
    from domaingen.sweep.ray_launcher import ray_chunk

    chunk_body = _RequeueableChunk() if entry == "slurm" else ray_chunk

    def body(job_id, config_kwargs, threads):  # a task of one job (--jobs_per_task 1)
        [result] = chunk_body([(job_id, config_kwargs)], threads, None)
        return result

    monkeypatch.setattr(logging.getLogger("domaingen"), "propagate", True)  # ray_job turns it off: restored after
    algorithm_plugin(make_plugin, f"{entry}_algs", "RemoteAlg")
    kwargs = dict(dataset="ColoredMNIST", algorithm="RemoteAlg", test_envs=[2], data_dir="embedded",
                  hparams=FAST_HPARAMS, steps=2, checkpoint_freq=1, plugins=[str(tmp_path / f"{entry}_algs.py")])
    ok = body("ok", {**kwargs, "output_dir": str(tmp_path / "ok")}, 1)
    assert ok.state == "done" and "RemoteAlg" in ALGORITHMS
    bad = body("bad", {**kwargs, "output_dir": str(tmp_path / "bad"), "plugins": [str(tmp_path / "gone.py")]}, 1)
    message = f"plugin {tmp_path / 'gone.py'}: no such file ({tmp_path / 'gone.py'} does not exist)"
    assert bad.state == "failed" and bad.message == message
    assert RunDirectory(tmp_path / "bad").failure_reason() == message


def test_entry_points_are_read_once_per_sys_path(monkeypatch, tmp_path):
    from importlib import metadata

    reads = []
    real = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points", lambda **kw: reads.append(kw) or real(**kw))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    plugins.load_entry_points()
    plugins.load_entry_points()
    assert len(reads) == 1
    monkeypatch.syspath_prepend(str(tmp_path / "b"))  # another sys.path may hold other distributions
    plugins.load_entry_points()
    assert len(reads) == 2
