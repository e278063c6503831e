"""Run settings declared once (run.settings): flags, spec keys, args.json and job ids come from the
declaration; sweeps and runs written by release 0.2.0 keep working; the time budget."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from domaingen.cli.main import build_parser, main
from domaingen.run.settings import NEVER, UNLESS
from domaingen.run.training import REQUEUE_EXIT_STATUS, SETTINGS, TrainConfig, train
from domaingen.sweep.spec import SPEC_KEYS, SPEC_SETTINGS, build_jobs, load_spec, parse_spec
from domaingen.testing import VOLATILE_FIELDS

FIXTURE = Path(__file__).parent / "fixtures" / "release_0_2_0"
# the interrupted and the uninterrupted run of the fixture: IRM, 6 steps, a checkpoint every 2
FIXTURE_RUN = ["--dataset", "ColoredMNIST", "--algorithm", "IRM", "--test_envs", "2", "--data_dir", "embedded",
               "--hparams", '{"featurizer": "MLP", "mlp_width": 8, "batch_size": 16}', "--steps", "6",
               "--checkpoint_freq", "2", "--hparams_seed", "1", "--in_domain_test", "0.1"]
# a new run beside the fixture's, under its protocol (0.2's default; DomainBed's experiment is today's for ERM and IRM)
NEW_RUN = [*FIXTURE_RUN, "--protocol", "paired"]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def subparser(*names: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in names:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def flag_dests(parser: argparse.ArgumentParser) -> set[str]:
    return {a.dest for a in parser._actions if a.option_strings and a.dest != "help"}


def records(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in VOLATILE_FIELDS}
            for line in (path / "results.jsonl").read_text().splitlines()]


def assert_records_match(actual: list[dict], expected: list[dict]) -> None:
    """The same records, key for key and step for step; exact but for floats, which match to 1e-6 relative.
    The fixtures were recorded on an AMD EPYC, and another CPU's kernels (AMX, AVX-512) may round a value
    such as IRM's penalty differently in its last bits; a resume on one machine is checked exactly apart."""
    assert [sorted(r) for r in actual] == [sorted(r) for r in expected]
    for got, want in zip(actual, expected):
        for key, value in want.items():
            if isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (want.get("step"), key)
            else:
                assert got[key] == value, (want.get("step"), key)


# ---- one declaration


def test_train_flags_are_exactly_the_declared_train_settings():
    assert flag_dests(subparser("train")) == {s.name for s in SETTINGS if s.info.train}


def test_spec_keys_are_the_sweep_keys_and_the_run_settings_a_sweep_may_set():
    own = {"algorithms", "datasets", "test_envs", "pairs", "n_hparams", "n_trials", "algorithm_hparams", "parts"}
    assert SPEC_KEYS == own | {s.name for s in SETTINGS if s.info.sweep}
    # the keys of a sweep.json written by release 0.2.0, and those added since (a recorded spec without
    # one reads as its default: the same spec)
    assert SPEC_KEYS == set(json.loads((FIXTURE / "sweep" / "sweep.json").read_text())) | {
        "shared_init", "image_cache", "compile_step"}


def test_sweep_launch_has_a_flag_for_every_spec_key_but_tables_and_plugins():
    dests = flag_dests(subparser("sweep", "launch"))
    assert SPEC_KEYS - {"parts", "algorithm_hparams", "plugins"} <= dests
    assert {"loggers", "time_budget", "data_dir", "output_dir"} <= dests


def test_args_json_holds_the_recorded_settings_under_their_names(tmp_path):
    train(TrainConfig(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(tmp_path / "r"), test_envs=[2],
                      data_dir="embedded", hparams={"featurizer": "MLP", "mlp_width": 8}, steps=1))
    args = json.loads((tmp_path / "r" / "args.json").read_text())
    assert set(args) == {s.name for s in SETTINGS if s.info.recorded} | {"embedded_data", "resolved_precision"}
    # release 0.2.0's names, and the settings added since (absent from an older args.json: their default)
    assert set(args) == set(json.loads((FIXTURE / "straight" / "args.json").read_text())) | {
        "shared_init", "linear_probe", "image_cache", "compile_step"}
    assert args["hparams"] == {"featurizer": "MLP", "mlp_width": 8}  # the overrides, as DomainBed records them
    assert args["steps"] == 1 and args["checkpoint_freq"] == 100 and args["eval_splits"] == "final"


def test_a_job_id_hashes_the_identity_settings_and_leaves_out_unless_values():
    data = {"algorithms": ["ERM"], "datasets": ["ColoredMNIST"], "test_envs": [[2]], "n_hparams": 1, "n_trials": 1,
            "steps": 5, "checkpoint_freq": 2}
    by_hand = {"dataset": "ColoredMNIST", "algorithm": "ERM", "test_envs": [2], "hparams": {}, "hparams_seed": 0,
               "trial_seed": 0, "steps": 5, "checkpoint_freq": 2, "holdout_fraction": 0.2, "precision": "fp32"}
    paired = hashlib.md5(json.dumps(by_hand, sort_keys=True).encode()).hexdigest()  # protocol left out at paired
    assert build_jobs(parse_spec({**data, "protocol": "paired"}))[0].job_id == paired
    domainbed = hashlib.md5(json.dumps({**by_hand, "protocol": "domainbed"}, sort_keys=True).encode()).hexdigest()
    assert build_jobs(parse_spec({**data, "protocol": "domainbed"}))[0].job_id == domainbed
    assert build_jobs(parse_spec(data))[0].job_id == domainbed  # the default where DomainBed has ERM and the data
    assert {s.name for s in SETTINGS if s.info.identity == UNLESS} == {
        "in_domain_test", "eval_splits", "train_in_every", "protocol", "shared_init", "linear_probe", "image_cache"}
    assert {s.name for s in SETTINGS if s.info.identity == NEVER} == {
        "output_dir", "data_dir", "device", "compile_eval", "compile_step", "plugins", "loggers",
        "time_budget"}


def test_train_takes_test_envs_with_commas_as_sweep_launch_does(tmp_path, capsys):
    common = ["--dataset", "ColoredMNIST", "--algorithm", "ERM", "--data_dir", "embedded", "--steps", "1",
              "--hparams", '{"featurizer": "MLP", "mlp_width": 8}']
    assert cli(capsys, "train", *common, "--test_envs", "0,1", "--output_dir", str(tmp_path / "a"))[0] == 0
    assert cli(capsys, "train", *common, "--test_envs", "0", "1", "--output_dir", str(tmp_path / "b"))[0] == 0
    assert json.loads((tmp_path / "a" / "args.json").read_text())["test_envs"] == [0, 1]
    assert json.loads((tmp_path / "b" / "args.json").read_text())["test_envs"] == [0, 1]


# ---- what release 0.2.0 wrote


@pytest.mark.parametrize("fmt, ext", [("markdown", "md"), ("csv", "csv"), ("latex", "tex")])
def test_a_0_2_0_sweep_collects_to_the_tables_it_gave_then(tmp_path, capsys, fmt, ext):
    sweep = shutil.copytree(FIXTURE / "sweep", tmp_path / "sweep")
    code, text, _ = cli(capsys, "collect", "--input_dir", str(sweep), "--format", fmt)
    then = (FIXTURE / f"tables.{ext}").read_text()
    if fmt == "latex":  # the same rows and cells; the layout for papers (bold, notes once, captions) is newer
        def rows(tex: str) -> list[str]:
            return [re.sub(r"\\(textbf|underline)\{([^}]*)\}", r"\2", line) for line in tex.splitlines()
                    if line.endswith(r"\\")]

        assert code == 0 and rows(text) == rows(then) and len(rows(then)) > 10
        captions = [re.findall(r"\\caption\{([^(}]*)", tex) for tex in (text, then)]
        assert [c.rstrip() for c in captions[0]] == [c.rstrip() for c in captions[1]]
        return
    assert code == 0 and text == then


def test_relaunching_a_0_2_0_sweep_runs_nothing(tmp_path, capsys):
    sweep = shutil.copytree(FIXTURE / "sweep", tmp_path / "sweep")
    recorded = json.loads((sweep / "sweep.json").read_text())
    assert {job.job_id for job in build_jobs(parse_spec(recorded))} == {p.name for p in sweep.iterdir() if p.is_dir()}
    code, out, _ = cli(capsys, "sweep", "launch", "--spec", str(FIXTURE / "sweep.toml"), "--output_dir", str(sweep),
                       "--data_dir", "embedded", "--launcher", "local", "--no_progress", "--yes")
    assert code == 0 and "48 jobs: 48 done" in out and "nothing to launch" in out


def test_a_run_interrupted_under_0_2_0_resumes_to_the_records_of_an_uninterrupted_run(tmp_path, capsys):
    run = shutil.copytree(FIXTURE / "interrupted", tmp_path / "run")
    assert [r["step"] for r in records(run)] == [0, 2]
    assert cli(capsys, "train", *FIXTURE_RUN, "--output_dir", str(run))[0] == 0
    assert_records_match(records(run), records(FIXTURE / "straight"))
    final, expected = (json.loads((p / "final.json").read_text()) for p in (run, FIXTURE / "straight"))
    assert_records_match([{k: v for k, v in final.items() if k != "seconds"}],
                         [{k: v for k, v in expected.items() if k != "seconds"}])


# ---- the time budget


def test_a_spent_time_budget_stops_at_a_checkpoint_with_the_requeue_status_and_resumes_exactly(tmp_path, capsys):
    run = tmp_path / "run"
    code, out, _ = cli(capsys, "train", *NEW_RUN, "--output_dir", str(run), "--time_budget", "1e-9")
    assert code == REQUEUE_EXIT_STATUS and "time budget of 1e-09 min reached" in out
    assert [r["step"] for r in records(run)] == [0] and not (run / "done").exists() and not (run / "failed").exists()
    assert cli(capsys, "train", *FIXTURE_RUN, "--output_dir", str(run))[0] == 0  # it keeps its protocol
    assert cli(capsys, "train", *NEW_RUN, "--output_dir", str(tmp_path / "straight"))[0] == 0
    assert records(run) == records(tmp_path / "straight")  # exactly, on one machine
    assert_records_match(records(run), records(FIXTURE / "straight"))


def test_a_sweep_with_a_spent_time_budget_exits_with_the_requeue_status_and_a_relaunch_finishes_it(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    launch = ["sweep", "launch", "--spec", str(FIXTURE / "sweep.toml"), "--data_dir", "embedded", "--launcher", "local",
              "--no_progress", "--yes", "--algorithms", "ERM", "--n_hparams", "1", "--n_trials", "1"]
    code, out, _ = cli(capsys, *launch, "--output_dir", str(sweep), "--protocol", "paired",  # the fixture's protocol
                       "--time_budget", "1e-9")
    assert code == REQUEUE_EXIT_STATUS and "6 incomplete" in out and "stopped at their time budget" in out
    code, out, _ = cli(capsys, *launch, "--output_dir", str(sweep))  # a relaunch keeps the recorded protocol
    assert code == 0 and "6 incomplete (to resume)" in out and "6 done" in out
    straight = tmp_path / "straight"
    assert cli(capsys, *launch, "--output_dir", str(straight), "--protocol", "paired")[0] == 0
    for job in build_jobs(parse_spec({**json.loads((sweep / "sweep.json").read_text())})):
        assert records(sweep / job.job_id) == records(straight / job.job_id)  # exactly, on one machine
        assert_records_match(records(sweep / job.job_id), records(FIXTURE / "sweep" / job.job_id))


# ---- bad input: one line, exit 2, nothing written


@pytest.mark.parametrize("extra, message", [
    (["--stepz", "3"], "domaingen train: error: unknown flag --stepz; did you mean --steps?"),
    (["--steps", "ten"], "domaingen train: error: argument --steps: expected an integer, got 'ten'"),
    (["--steps", "0"], "domaingen train: error: argument --steps: expected at least 1, got 0"),
    (["--precision", "fp16"], "domaingen train: error: argument --precision: expected one of fp32, bf16, auto, "
                              "got 'fp16'"),
    (["--time_budget", "0"], "domaingen train: error: argument --time_budget: expected a positive number of "
                             "minutes, got 0"),
    (["--hparams", '{"lr": "fast"}'], "domaingen: error: hyperparameter 'lr' must be a finite number, got 'fast' "
                                      "(from --hparams)"),
])
def test_a_bad_train_flag_is_one_line_naming_the_setting(tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    code, _, err = cli(capsys, "train", "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--data_dir", "embedded",
                       "--output_dir", str(out), *extra)
    assert code == 2 and err.strip() == message and not out.exists()


@pytest.mark.parametrize("line, message", [
    ('steps = "ten"', "domaingen: error: steps must be an integer, got 'ten' ({spec}, key 'steps')"),
    ("n_trails = 2", "domaingen: error: {spec}: unknown key 'n_trails'; did you mean n_trials? (valid keys: "),
    ('precision = "fp16"', "domaingen: error: precision must be one of fp32, bf16, auto, got 'fp16' ({spec}, key "
                           "'precision')"),
])
def test_a_bad_spec_value_names_the_file_and_key(tmp_path, capsys, line, message):
    spec = tmp_path / "spec.toml"
    spec.write_text(f'algorithms = ["ERM"]\ndatasets = ["ColoredMNIST"]\n{line}\n')
    code, _, err = cli(capsys, "sweep", "launch", "--spec", str(spec), "--output_dir", str(tmp_path / "o"), "--yes")
    assert code == 2 and err.startswith(message.format(spec=spec)) and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_resuming_with_a_changed_identity_setting_names_it_and_both_values(tmp_path, capsys):
    run = shutil.copytree(FIXTURE / "interrupted", tmp_path / "run")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run.iterdir())
    changed = [a if a != "6" else "7" for a in FIXTURE_RUN]
    code, _, err = cli(capsys, "train", *changed, "--output_dir", str(run))
    assert code == 2 and err.strip() == (f"domaingen: error: {run} holds a run with different arguments (steps: 6 "
                                         "there, 7 now); choose another --output_dir or delete that directory")
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run.iterdir()) == before


def test_relaunching_a_0_2_0_sweep_with_a_changed_identity_setting_names_it_and_both_values(tmp_path, capsys):
    sweep = shutil.copytree(FIXTURE / "sweep", tmp_path / "sweep")
    code, _, err = cli(capsys, "sweep", "launch", "--spec", str(FIXTURE / "sweep.toml"), "--output_dir", str(sweep),
                       "--steps", "7", "--data_dir", "embedded", "--launcher", "local", "--yes")
    assert code == 2 and f"{sweep} holds a sweep with a different spec (steps: 5 there, 7 now)" in err


def test_every_declared_setting_has_help_and_a_known_identity():
    for item in (*SETTINGS, *SPEC_SETTINGS):
        assert item.info.help and item.info.identity in ("always", "unless", "never"), item.name


def test_sweep_launch_reads_each_test_envs_token_as_one_held_out_set(tmp_path, capsys):
    code, out, _ = cli(capsys, "sweep", "launch", "--algorithms", "ERM", "--datasets", "ColoredMNIST", "--test_envs",
                       "2", "0,1", "--n_hparams", "1", "--n_trials", "1", "--output_dir", str(tmp_path / "s"), "--dry")
    held_out = [line.split("--test_envs ")[1].split(" --")[0] for line in out.splitlines()
                if line.startswith("domaingen train")]
    assert code == 0 and held_out == ["2", "0 1"]
