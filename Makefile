# knobtune: `make demo` runs the PyTorch digits study, `make test` runs the test suite.
# Both create .venv and install into it. torch is installed only when none is importable, and then
# as the pinned CPU build (torch==2.13.0): a range would pull a multi-GB CUDA build on a CPU box.
# On a GPU box whose Python already has a CUDA torch, .venv sees it (--system-site-packages) and
# keeps it: `make demo PYTHON=/path/to/that/python`.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_CPU := torch==2.13.0
STAMP := $(VENV)/.knobtune-installed
STUDY ?= studies/digits-mlp-pytorch.toml

.PHONY: install demo test test-cuda benchmark dashboard clean

$(PY):
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
		echo "using the torch of $(PYTHON) (--system-site-packages)"; \
		$(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
		$(PYTHON) -m venv $(VENV); \
	fi

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || { echo "installing $(TORCH_CPU) (CPU build)"; \
		$(PY) -m pip install -q --disable-pip-version-check $(TORCH_CPU); }
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/knobtune run $(STUDY)

test: install
	$(PY) -m pytest -q

test-cuda: install
	$(PY) -m pytest -q -m cuda

benchmark: install
	$(PY) benchmarks/search_vs_grid.py

dashboard: install
	$(VENV)/bin/knobtune dashboard

clean:
	rm -rf $(VENV) knobtune.db knobtune.db-wal knobtune.db-shm best.json
