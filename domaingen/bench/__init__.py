"""`make bench`: speed and memory benchmarks (benchmarks.py) and the comparison with an earlier
commit (baseline.py). `python -m domaingen.bench` runs them."""
