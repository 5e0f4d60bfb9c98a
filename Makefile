# Two commands for a fresh machine:  make demo   and   make test
# Both create .venv if needed and install the project into it first.
#
# Installation ends by building the C++ ops this environment uses, once, as a wheel would be compiled (each reports
# and is not fatal when it cannot build): DeepSpeed's CPU Adam (ZeRO's optimizer offload;
# ecomkit.parallel.zero.env.prebuild_cpu_adam), DeepSpeed's shared-memory all-reduce (--ddp-allreduce shm) and
# ecomkit's AVX-512 GeLU and loss kernels (--cpu-kernels, ecomkit/fast/cpu_kernels.py).
#
# TORCH_SPEC pins torch for a reproducible CPU set-up (2.13.0 resolves to a CPU
# build here); pyproject.toml only gives torch a floor, so `pip install -e .` keeps
# the torch it finds. GPU users: see docs/gpu.md.
VENV       ?= .venv
PYTHON     ?= python3
TORCH_SPEC ?= torch==2.13.0
PY          = $(VENV)/bin/python
STAMP       = $(VENV)/.ecomkit-installed
TEST_WORKERS ?= 2
export OMP_NUM_THREADS ?= 1
export ECOMKIT_CACHE ?= $(CURDIR)/.cache/ecomkit

.PHONY: demo test install bench clean-runs notebooks

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24,<26.2"
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[notebooks,test]"
	$(PY) -c "from ecomkit.parallel.zero.env import prebuild_cpu_adam; print(prebuild_cpu_adam())"
	$(PY) -c "from ecomkit.fast.shm_allreduce import prebuild_shm_op; print(prebuild_shm_op())"
	$(PY) -c "from ecomkit.fast.cpu_kernels import load_cpu_kernels; print('ecomkit CPU kernels:', load_cpu_kernels().reason)"
	touch $(STAMP)

# The first run: 2 DDP processes train the tiny preset to name a product title's category, then print its
# accuracy beside the baseline, which model it is, and the next command (scripts/00_demo.py; tests/test_demo.py
# runs this very line).
demo: $(STAMP)
	$(PY) -m torch.distributed.run --standalone --nproc_per_node 2 scripts/00_demo.py --output-dir runs/demo

# The whole suite: the import floors (lint-imports), the measured tables of the docs (benchmarks/report.py DOCS)
# against their artifacts, the guides' claims page (docs/claims.md) and the README's verdict counts against the ledger,
# unit + 2-process gloo tests and every notebook, in two phases:
# 1. everything not marked `serial`, on two pytest workers, a test file per worker at a time (--dist loadfile keeps
#    a file's module-scoped fixtures to one launch). Most of a test is one process starting and importing torch,
#    so two workers fill both cores. Files go out in collection order, which tests/conftest.py sorts longest
#    first (--no-loadscope-reorder keeps xdist from re-sorting them by their number of tests);
# 2. the `serial` items alone: those that assert timings (the time model, rendezvous timeouts), which a second
#    job on the same cores would distort.
# --durations prints the slowest items at the end, so the suite's time budget (~15 min) has its costs named.
PYTEST = $(PY) -m pytest tests notebooks --nbmake -q --durations=30
test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) benchmarks/report.py --check
	$(PY) -m ecomlab.claims --check
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial"
	$(PYTEST) -m serial

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done
	$(PY) benchmarks/report.py

# The chapters are committed executed, so a reader sees every output without running anything. This runs each one
# top to bottom (or only NB=03, NB="03 04") and stamps each code cell with the hash of its source;
# tests/test_notebook_outputs.py fails when a cell changed after its notebook ran. make test still executes every
# notebook from scratch (pytest --nbmake).
NB ?=
notebooks: $(STAMP)
	$(PY) notebooks/execute.py $(NB)

clean-runs:
	rm -rf runs
