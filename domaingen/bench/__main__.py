"""`python -m domaingen.bench [--only SECTION ...]`: the benchmarks."""

from domaingen.bench.benchmarks import main

if __name__ == "__main__":
    raise SystemExit(main())
