# knobtune: `make demo` runs the digits-mlp study in PyTorch and in TensorFlow and compares them;
# `make test` runs the test suite. Both create .venv and install into it. torch and TensorFlow are
# installed only when none is importable, and then as the pinned CPU builds (torch==2.13.0,
# tensorflow-cpu==2.21.0): a torch range would pull a multi-GB CUDA build on a CPU box. On a GPU
# box whose Python already has CUDA builds, .venv sees them (--system-site-packages) and keeps
# them: `make demo PYTHON=/path/to/that/python`.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_CPU := torch==2.13.0
TF_CPU := tensorflow-cpu==2.21.0
STAMP := $(VENV)/.knobtune-installed
KNOBTUNE := $(VENV)/bin/knobtune

.PHONY: install demo demo-pytorch demo-tensorflow test test-long test-cuda benchmark dashboard clean

$(PY):
	@if $(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -c "import tensorflow" 2>/dev/null; then \
		echo "using the frameworks of $(PYTHON) (--system-site-packages)"; \
		$(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
		$(PYTHON) -m venv $(VENV); \
	fi

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || { echo "installing $(TORCH_CPU) (CPU build)"; \
		$(PY) -m pip install -q --disable-pip-version-check $(TORCH_CPU); }
	@$(PY) -c "import tensorflow" 2>/dev/null || { echo "installing $(TF_CPU)"; \
		$(PY) -m pip install -q --disable-pip-version-check $(TF_CPU); }
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

demo: demo-pytorch demo-tensorflow
	$(KNOBTUNE) compare digits-mlp-pytorch digits-mlp-tensorflow

demo-pytorch: install
	$(KNOBTUNE) run studies/digits-mlp-pytorch.toml

demo-tensorflow: install
	$(KNOBTUNE) run studies/digits-mlp-tensorflow.toml

# The tests run in PYTEST_WORKERS processes (pytest-xdist; each has its own warm servers and data
# cache): most of a test's time is a child process's, and tests wait on their children, so on a
# 2-core box two workers left 11-13 % of the CPU idle and three keep it 96 % busy (README).
# PYTEST_WORKERS=0 runs them in this one process.
PYTEST_WORKERS ?= 3

# `make test` is the ten-minute suite; the six tests marked `long` (each an end-to-end run of the
# Hugging Face Trainer, Lightning, a hand-written TensorFlow step, or a data-parallel script and its
# winner in production: 40-70 s each here) run in `make test-long`. CI runs both; plain `pytest`, all.
test: install
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup -m "not long" --durations=10

test-long: install
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup -m long

test-cuda: install
	$(PY) -m pytest -q -m cuda

benchmark: install
	$(PY) benchmarks/search_vs_grid.py
	$(PY) benchmarks/frameworks.py
	$(PY) benchmarks/search_quality.py
	$(PY) benchmarks/guard_cost.py
	$(PY) benchmarks/api_overhead.py
	$(PY) benchmarks/own_loop.py
	$(PY) benchmarks/parallel_jobs.py
	$(PY) benchmarks/warm_start.py
	$(PY) benchmarks/real_workloads.py
	$(PY) benchmarks/trainer_libraries.py

dashboard: install
	$(VENV)/bin/knobtune dashboard

clean:
	rm -rf $(VENV) knobtune.db knobtune.db-wal knobtune.db-shm knobtune-artifacts best.json report.html
