"""The command line: every error a user can cause gives one clear line and a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAST_HPARAMS
from domaingen.cli.main import main

FAST = json.dumps(FAST_HPARAMS)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def train_args(out: Path, *extra: str) -> list[str]:
    base = ["train", "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--test_envs", "2",
            "--data_dir", "embedded", "--steps", "3", "--checkpoint_freq", "2", "--hparams", FAST,
            "--output_dir", str(out)]
    return base + list(extra)


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def existing_run(tmp_path, capsys) -> Path:
    out = tmp_path / "run"
    code, _, _ = run_cli(capsys, *train_args(out))
    assert code == 0
    return out


def replace_flag(argv: list[str], flag: str, value: str) -> list[str]:
    argv = list(argv)
    argv[argv.index(flag) + 1] = value
    return argv


BAD_INPUTS = [
    ("--algorithm", "ERN", "unknown algorithm 'ERN'; did you mean 'ERM'? valid algorithms: "),
    ("--algorithm", "Zyzzyva", "(one of your own: load its module with --plugins MODULE)"),
    ("--dataset", "CMNIST", "unknown dataset 'CMNIST'; did you mean 'ColoredMNIST'? valid datasets: ColoredMNIST, "
                            "IRMColoredMNIST, RotatedMNIST"),
    ("--test_envs", "-95%", "unknown test environment '-95%' of ColoredMNIST; give an index or a name: "
                            "0=+90%, 1=+80%, 2=-90%"),
    ("--test_envs", "3", "test environment 3 is out of range for ColoredMNIST, which has 3 environments"),
    ("--hparams", '{"lr": ', "--hparams is not valid JSON"),
    ("--hparams", '{"learning_rate": 0.1}', "unknown hyperparameter(s) learning_rate; valid names:"),
]


@pytest.mark.parametrize("flag, value, message", BAD_INPUTS, ids=[b[0] + "=" + b[1] for b in BAD_INPUTS])
def test_bad_input_gives_one_line_and_touches_nothing(existing_run, capsys, flag, value, message):
    before = snapshot(existing_run)
    code, out, err = run_cli(capsys, *replace_flag(train_args(existing_run), flag, value))
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("domaingen: error: ") and message in lines[0]
    assert "Traceback" not in err
    assert snapshot(existing_run) == before


def test_different_arguments_in_existing_run_directory_are_refused(existing_run, capsys):
    before = snapshot(existing_run)
    code, _, err = run_cli(capsys, *replace_flag(train_args(existing_run), "--steps", "5"))
    assert code != 0
    assert "holds a run with different arguments (steps: 3 there, 5 now" in err
    assert snapshot(existing_run) == before


def test_missing_data_names_the_files_and_the_fix(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DOMAINGEN_DATA", str(tmp_path / "empty"))
    (tmp_path / "run").mkdir()
    argv = [a for a in train_args(tmp_path / "run") if a not in ("--data_dir", "embedded")]
    code, _, err = run_cli(capsys, *argv)
    assert code != 0
    assert len(err.strip().splitlines()) == 1
    assert f"MNIST not found in {tmp_path / 'empty' / 'MNIST' / 'raw'}" in err
    assert "train-images-idx3-ubyte" in err and "--data_dir embedded" in err
    assert list((tmp_path / "run").iterdir()) == []


def test_rerun_of_done_run_says_so(existing_run, capsys):
    code, out, _ = run_cli(capsys, *train_args(existing_run))
    assert code == 0 and "already done" in out


def test_list_shows_environments_and_hparams(capsys):
    code, out, _ = run_cli(capsys, "list")
    assert code == 0
    assert "0:+90%, 1:+80%, 2:-90%" in out
    assert "irm_lambda" in out and "10^U(-1,5)" in out
    assert "SANDMask" in out and "0.5; U(0,1)" in out
    assert "modreg_alpha" not in out.split("Compositions")[0]  # compositions are listed once, not per algorithm
    assert "X+ModReg for every algorithm X above" in out and "6.93e-10; 10^U(-9,-5)" in out


def test_module_and_console_script_are_the_same_program(tmp_path):
    by_module = subprocess.run([sys.executable, "-m", "domaingen", "list"], capture_output=True, text=True)
    script = Path(sys.executable).with_name("domaingen")
    by_script = subprocess.run([str(script), "list"], capture_output=True, text=True)
    assert by_module.returncode == 0 and by_script.returncode == 0
    assert by_module.stdout == by_script.stdout and "ColoredMNIST" in by_module.stdout


def test_failed_run_exits_non_zero_with_reason(tmp_path, capsys):
    argv = replace_flag(train_args(tmp_path / "run"), "--hparams", json.dumps({**FAST_HPARAMS, "lr": 1e30}))
    code, _, err = run_cli(capsys, *argv)
    assert code != 0
    assert "non-finite loss" in err
    assert (tmp_path / "run" / "failed").exists()


def test_a_user_algorithm_is_one_registered_class(tmp_path, capsys):
    import torch.nn.functional as F

    from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, concat
    from domaingen.hparams import HParam, log_uniform

    @ALGORITHMS.register("InlineSmoothing")
    class InlineSmoothing(FeaturizerClassifier):
        """ERM with label smoothing."""

        HPARAMS = {"smoothing": HParam(0.1, log_uniform(-3, -0.5))}

        def update(self, minibatches):
            x, y = concat(minibatches)
            loss = F.cross_entropy(self.predict(x), y, label_smoothing=self.hparams["smoothing"])
            self.step(loss)
            return {"loss": loss.item()}

    try:
        code, out, _ = run_cli(capsys, "list")
        assert "InlineSmoothing" in out and "smoothing" in out
        args = replace_flag(train_args(tmp_path / "run"), "--algorithm", "InlineSmoothing")
        code, out, _ = run_cli(capsys, *args)
        assert code == 0 and "done" in out
        record = json.loads((tmp_path / "run" / "results.jsonl").read_text().splitlines()[-1])
        assert record["hparams"]["smoothing"] == 0.1
    finally:
        ALGORITHMS.unregister("InlineSmoothing")


@pytest.mark.parametrize("where, message", [
    ("file", "--output_dir {} is a file, not a directory; choose another --output_dir"),
    ("file/run", "--output_dir {}: {} is a file, not a directory; choose another --output_dir"),
])
def test_output_dir_that_is_a_file_gives_one_line(tmp_path, capsys, where, message):
    (tmp_path / "file").write_text("a file\n")
    out = tmp_path / where
    code, _, err = run_cli(capsys, *train_args(out))
    assert code == 2
    assert err.strip() == "domaingen: error: " + message.format(out, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "a file\n"
