"""The benchmark's reading of CPU steal from /proc/stat."""

import io

import torch

from domaingen.algorithms import ALGORITHMS
from domaingen.bench import benchmarks as bench


def test_held_memory_counts_the_weight_averages():
    hparams = {"lr": 1e-3, "weight_decay": 0.0, "featurizer": "MLP", "mlp_width": 8, "mlp_depth": 3,
               "mlp_dropout": 0.0, "ema_decay": 0.9}
    batches = [(torch.randn(4, 5), torch.randint(0, 2, (4,))) for _ in range(2)]
    held = {}
    for name in ("ERM", "ERM+EMA"):
        torch.manual_seed(0)
        model = ALGORITHMS.get(name)((5,), 2, 2, hparams)
        model.update(batches)
        held[name] = bench.held_memory_mb(model)
    # by hand: weights + gradients + Adam's two moments (and its step counts), then one more copy of the weights
    weights = sum(p.numel() * 4 for p in model.network.parameters())
    steps = sum(4 for _ in model.network.parameters())  # Adam's float32 step counter per parameter
    assert held["ERM"] * 2**20 == 4 * weights + steps
    assert (held["ERM+EMA"] - held["ERM"]) * 2**20 == weights  # the average (its integer counters are not counted)


def test_steal_fraction_is_the_share_of_stolen_jiffies():
    # 30 of the 100 jiffies that passed went to other guests.
    assert bench.steal_fraction((10, 1000), (40, 1100)) == 0.3
    assert bench.steal_fraction(None, (40, 1100)) is None
    assert bench.steal_fraction((10, 1000), (10, 1000)) is None


def test_cpu_time_counters_parse_proc_stat(monkeypatch):
    line = "cpu  100 20 30 400 5 0 1 44 7 0\ncpu0 1 2 3 4 5 6 7 8 9 0\n"
    monkeypatch.setattr("builtins.open", lambda *a, **k: io.StringIO(line))
    # steal is the 8th number; guest time (9th) is already counted in user time.
    assert bench.cpu_time_counters() == (44, 100 + 20 + 30 + 400 + 5 + 0 + 1 + 44)


def test_cpu_time_counters_without_proc_stat(monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError("/proc/stat")

    monkeypatch.setattr("builtins.open", missing)
    assert bench.cpu_time_counters() is None


def test_overhead_table_steps_only_the_precisions_asked_for(monkeypatch):
    """`--precisions fp32` (a CPU without native bf16, where bf16 is emulated) steps and prints fp32 alone."""
    stepped = []

    class Timed:
        def __init__(self, name):
            self.name = name

        def update(self, batches):
            stepped.append((self.name, torch.is_autocast_enabled("cpu")))

    monkeypatch.setattr(bench, "_overhead_model", lambda name, device, setting: (Timed(name), []))
    monkeypatch.setattr(bench, "step_memory_mb", lambda model, batches, device, precision: 1.0)
    monkeypatch.setattr(bench, "state_memory_mb", lambda model: 1.0)
    rows = bench.bench_overhead_table(["IRM"], "ERM", 2, "MNIST_CNN", ("fp32",))
    assert stepped and not any(autocast for _, autocast in stepped)  # no bf16 step at all
    assert len(stepped) == 2 * (2 + 3)  # two models, steps plus three warm-up steps
    assert len(rows) == 1 and rows[0][0] == "IRM / ERM, MNIST_CNN"
    assert rows[0][1].startswith("fp32: ") and "bf16" not in rows[0][1] and "memory 1.00x" in rows[0][1]


def test_the_loader_line_states_both_rates_and_their_ratio():
    assert bench.loader_line(100.4, 351.2) == "image loader: PIL 100 images/s, cache 351 images/s = 3.50x"


def test_the_loader_section_times_both_paths_on_a_generated_tree():
    import re

    line, rows = bench.bench_loader(per_class=1, batches=1, rounds=1)
    match = re.fullmatch(r"image loader: PIL (\d+) images/s, cache (\d+) images/s = (\d+\.\d\d)x", line)
    assert match
    values = dict(rows)
    assert values["image loader, cache over PIL"] == f"{match.group(3)}x"
    assert any(key.startswith("image cache build (28 images") for key in values)
