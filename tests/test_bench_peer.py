"""bench --only peer: the checks on --peer, the child timing, the step mean and the projection
(a fake DomainBed checkout stands in for the real one; no timing is asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from domaingen.bench import peer
from domaingen.bench.benchmarks import main
from domaingen.errors import DomaingenError


@pytest.mark.parametrize("argv, message", [
    (["--only", "peer"], "--only peer needs --peer DIR, a DomainBed checkout"),
    (["--only", "peer", "--peer", "{tmp}"], "is not a DomainBed checkout: it has no domainbed/scripts/train.py"),
])
def test_peer_that_is_not_a_domainbed_checkout_one_line_exit_2(tmp_path, capsys, argv, message):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_mean_step_weights_each_record_by_its_steps():
    # records at steps 0, 50, 100: intervals of 1, 50 and 50 steps
    records = [{"step": 0, "step_time": 1.0}, {"step": 50, "step_time": 0.2}, {"step": 100, "step_time": 0.4}]
    assert peer._mean_step(records) == pytest.approx((1.0 + 50 * 0.2 + 50 * 0.4) / 101)


def test_timed_child_reports_wall_cpu_and_peak_memory(tmp_path):
    # a child that holds about 200 MB and spins a little
    code = "import time; b = bytearray(200 * 2**20); t = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    wall, cpu, rss = peer.timed_child([sys.executable, "-c", code], {}, tmp_path, tmp_path / "log")
    assert wall >= cpu * 0.5 and cpu >= 0.3 and 0.2 <= rss < 1.0
    with pytest.raises(RuntimeError, match="failed: .*ZeroDivisionError"):
        peer.timed_child([sys.executable, "-c", "1/0"], {}, tmp_path, tmp_path / "log")


def _fake_peer(tmp_path, costs, b_step_factor=1.0, order=None):
    """A fake DomainBed checkout under tmp_path and a fake `timed_child`: the child named by `costs`
    (DomainBed, domaingen, or `domaingen --precision bf16`) takes fixed + steps x step + checkpoints x check
    seconds, its B run's steps `b_step_factor` times slower; `order` collects (tool, checkpoint_freq)."""
    (tmp_path / "DomainBed" / "domainbed" / "scripts").mkdir(parents=True)
    (tmp_path / "DomainBed" / "domainbed" / "scripts" / "train.py").write_text("")

    def fake_child(command, env, cwd, log_path):
        if "domainbed.scripts.train" in command:
            tool = "DomainBed"
        else:
            tool = "domaingen --precision bf16" if "--precision" in command else "domaingen"
        steps = int(command[command.index("--steps") + 1])
        freq = int(command[command.index("--checkpoint_freq") + 1])
        if order is not None:
            order.append((tool, freq))
        out = Path(command[command.index("--output_dir") + 1])
        checks = [s for s in range(steps) if s % freq == 0 or s == steps - 1]
        fixed, step, check = costs[tool]
        step *= b_step_factor if freq > steps else 1.0
        out.mkdir(parents=True)
        (out / "results.jsonl").write_text("".join(json.dumps({"step": s, "step_time": step}) + "\n" for s in checks))
        return fixed + steps * step + len(checks) * check, 1.0, 0.5

    return fake_child


def test_projection_from_two_runs_per_tool(tmp_path, monkeypatch):
    """A fake checkout and fake children: each 'tool' takes 2 s + 0.1 s a step + 3 s a checkpoint (DomainBed)
    or 1 s + 0.05 s a step + 1 s a checkpoint (domaingen); the projection must recover the full run."""
    costs = {"DomainBed": (2.0, 0.1, 3.0), "domaingen": (1.0, 0.05, 1.0)}
    monkeypatch.setattr(peer, "timed_child", _fake_peer(tmp_path, costs))
    rows = dict((r[0], r[1]) for r in peer.peer_rows(str(tmp_path / "DomainBed"), str(tmp_path), 101, 50))
    full = {tool: fixed + 5001 * step + 51 * check for tool, (fixed, step, check) in costs.items()}
    line = rows["full run projection (5001 steps, 51 checkpoints): DomainBed / domaingen"]
    assert line == (f"{full['DomainBed'] / 60:.1f} min / {full['domaingen'] / 60:.1f} min = "
                    f"{full['DomainBed'] / full['domaingen']:.2f}x")
    with pytest.raises(DomaingenError, match="not a DomainBed checkout"):
        peer.check_peer(str(tmp_path))


def test_stacked_step_equals_each_model_s_own_adam_step():
    """bench --only batching times a vmapped step: it must be the same training as N Adam steps."""
    import copy

    import torch
    from torch.func import stack_module_state

    from domaingen.algorithms.base import classification_loss
    from domaingen.bench.batching import MODELS, StackedAdam

    make, shape = MODELS["MLP"]
    torch.manual_seed(0)
    models = [make() for _ in range(3)]
    twins = [copy.deepcopy(m) for m in models]
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in twins]
    step = StackedAdam(models)
    for _ in range(3):
        x, y = torch.randn(3, 16, *shape), torch.randint(0, 2, (3, 16))
        step(x, y)
        for twin, opt, xi, yi in zip(twins, optimizers, x, y):
            opt.zero_grad()
            classification_loss(twin(xi), yi).backward()
            opt.step()
    expected = stack_module_state(twins)[0]
    assert list(step.params) == list(expected)
    for name, want in expected.items():
        assert (step.params[name] - want).abs().max() < 1e-5, name


def test_a_peer_whose_train_py_fails_is_one_line_exit_2(tmp_path, capsys):
    """DomainBed's own imports failing (BackPACK or wilds missing) ends the benchmark in one line that names
    the error and what to install, not a traceback pointing at a log the temporary directory took with it."""
    from domaingen.bench.benchmarks import main as bench_main

    scripts = tmp_path / "DomainBed" / "domainbed" / "scripts"
    scripts.mkdir(parents=True)
    (scripts / "__init__.py").write_text("")
    (scripts.parent / "__init__.py").write_text("")
    (scripts / "train.py").write_text("import a_module_nobody_has\n")
    code = bench_main(["--only", "peer", "--peer", str(tmp_path / "DomainBed"), "--data_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "domainbed.scripts.train failed: ModuleNotFoundError: No module named 'a_module_nobody_has'" in err
    assert "must import in this Python" in err and "log:" not in err


def test_several_variants_share_one_domainbed_run(tmp_path, monkeypatch):
    """`--peer_args` repeated: each domaingen variant gets its own rows and projection against the same two
    DomainBed children, and the children alternate DomainBed, variant 1, variant 2 for A, then for B."""
    costs = {"DomainBed": (2.0, 0.1, 3.0), "domaingen": (1.0, 0.05, 1.0), "domaingen --precision bf16": (1.0, 0.02, 0.5)}
    order = []
    monkeypatch.setattr(peer, "timed_child", _fake_peer(tmp_path, costs, order=order))
    rows = dict((r[0], r[1]) for r in peer.peer_rows(str(tmp_path / "DomainBed"), str(tmp_path), 101, 50,
                                                    variants=[[], ["--precision", "bf16"]]))
    assert order == [(tool, freq) for freq in (50, 102) for tool in costs]
    full = {tool: fixed + 5001 * step + 51 * check for tool, (fixed, step, check) in costs.items()}
    for name in ("domaingen", "domaingen --precision bf16"):
        line = rows[f"full run projection (5001 steps, 51 checkpoints): DomainBed / {name}"]
        assert line == (f"{full['DomainBed'] / 60:.1f} min / {full[name] / 60:.1f} min = "
                        f"{full['DomainBed'] / full[name]:.2f}x")
    with pytest.raises(DomaingenError, match="--peer_args names one domaingen variant twice: domaingen, domaingen$"):
        peer.peer_rows(str(tmp_path / "DomainBed"), str(tmp_path), variants=[[], []])


def test_projection_subtracts_each_run_s_own_steps(tmp_path, monkeypatch):
    """A B run whose steps are slower than its A run's (a warm-up, a moment of load) must not read as a cheaper
    checkpoint: with B's step 1.5x A's, the projection still recovers the checkpoint cost, and steps at the mean."""
    costs = {"DomainBed": (2.0, 0.1, 3.0), "domaingen": (1.0, 0.05, 1.0)}
    monkeypatch.setattr(peer, "timed_child", _fake_peer(tmp_path, costs, b_step_factor=1.5))
    rows = dict((r[0], r[1]) for r in peer.peer_rows(str(tmp_path / "DomainBed"), str(tmp_path), 101, 25))
    for tool, (fixed, step, check) in costs.items():
        assert rows[f"  {tool}: start-up and first/last checkpoints, per further checkpoint"] == \
            f"{fixed + 2 * check:.1f} s, {check:.1f} s"
    full = {tool: fixed + 5001 * step * 1.25 + 51 * check for tool, (fixed, step, check) in costs.items()}
    assert rows["full run projection (5001 steps, 51 checkpoints): DomainBed / domaingen"] == \
        f"{full['DomainBed'] / 60:.1f} min / {full['domaingen'] / 60:.1f} min = {full['DomainBed'] / full['domaingen']:.2f}x"
