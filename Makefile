# domaingen: one-command set-up, tests, demo and benchmarks.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DATA   ?= $(if $(DOMAINGEN_DATA),$(DOMAINGEN_DATA),$(wildcard ../shared/data))
export DOMAINGEN_DATA := $(DATA)

.PHONY: install test demo bench download tables clean

$(PY):
	$(PYTHON) -m venv $(VENV)

install: $(PY)  ## the package, its console command, and the test extras, in ./.venv
	$(PY) -m pip install -e '.[dev]'

test:  ## the whole suite (1-10 minutes on 2 idle cores); real-MNIST tests need DOMAINGEN_DATA
	$(PY) -m pytest -q

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

clean:
	rm -rf sweeps_out .pytest_cache build dist *.egg-info
