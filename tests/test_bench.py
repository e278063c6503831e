"""The benchmark's reading of CPU steal from /proc/stat."""

import io

from domaingen.bench import benchmarks as bench
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
