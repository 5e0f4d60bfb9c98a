# Two commands for a fresh machine:  make demo   and   make test
# Both create .venv if needed and install the project into it first.
#
# TORCH_SPEC pins torch for a reproducible CPU set-up (2.13.0 resolves to a CPU
# build here). GPU users: see README, "GPU install".
VENV       ?= .venv
PYTHON     ?= python3
TORCH_SPEC ?= torch==2.13.0
PY          = $(VENV)/bin/python
STAMP       = $(VENV)/.ecomkit-installed
export OMP_NUM_THREADS ?= 1
export ECOMKIT_CACHE ?= $(CURDIR)/.cache/ecomkit

.PHONY: demo test install bench clean-runs notebooks-clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24,<26.2"
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[notebooks,test]"
	touch $(STAMP)

# The main job: 2-process data-parallel training on the embedded synthetic catalog.
demo: $(STAMP)
	$(PY) -m torch.distributed.run --standalone --nproc_per_node 2 scripts/02_data_parallel.py --output-dir runs/demo

# The whole suite: the import floors (lint-imports), the README's measured tables against their artifacts,
# the guides' claims page (docs/claims.md) and the README's verdict counts against the ledger,
# unit + 2-process gloo tests, then every notebook.
test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) benchmarks/report.py --check
	$(PY) -m ecomkit.claims --check
	$(PY) -m pytest tests notebooks --nbmake -q

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done
	$(PY) benchmarks/report.py

notebooks-clean:
	$(PY) -m nbconvert --clear-output --inplace notebooks/*.ipynb

clean-runs:
	rm -rf runs
