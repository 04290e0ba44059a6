# Two commands set up everything on a fresh machine:
#   make demo   - the whole pipeline end to end on the embedded synthetic dataset
#   make demo-cellpainting - Cell Painting (JUMP twin) staged from the S3 double, verified
#   make test   - lint, type-check, the docs site (strict) and the default test suite
# Heavier tiers: make test-slow, make test-xla (own environment: torch 2.9.0 + torch-xla 2.9.0),
# make test-py312 (the default suite on Python 3.12, in its own environment).
PYTHON ?= python3
VENV ?= .venv
XLA_VENV ?= .venv-xla
# The newer interpreter CI also runs the default suite on (requires-python allows 3.11-3.13):
# from PATH, else pyenv's.
PYENV_DIR := $(or $(PYENV_ROOT),$(HOME)/.pyenv)
PY312 ?= $(or $(shell PYENV_VERSION= command -v python3.12 2>/dev/null | grep -v shims),$(lastword $(sort $(wildcard $(PYENV_DIR)/versions/3.12*/bin/python3.12))),python3.12)
PY312_VENV ?= .venv-py312
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
XLA_STAMP := $(XLA_VENV)/.installed
PY312_STAMP := $(PY312_VENV)/.installed
DEMO_DIR ?= demo-output

.PHONY: demo demo-hba1c demo-cellpainting test test-slow test-xla test-py312 lint docs bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[cloud,train,torch,dev]"
	touch $@

# torch 2.9.0 + torch-xla 2.9.0 (~4.2 GB download, 8.2 GB installed: PyPI's Linux torch is a CUDA
# build, which runs fine on a CPU-only machine), the package and the test runner; no dev or cloud
# extras. --no-cache-dir here and for Python 3.12 (whose torch is also PyPI's CUDA build, 6.7 GB):
# pip's cache would otherwise keep another copy of each download on the disk the tiers share.
$(XLA_STAMP): pyproject.toml
	$(PYTHON) -m venv $(XLA_VENV)
	$(XLA_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(XLA_VENV)/bin/python -m pip install --quiet --no-cache-dir -e ".[train,xla]" "pytest>=8" "pytest-timeout>=2.3"
	touch $@

$(PY312_STAMP): pyproject.toml
	$(PY312) -m venv $(PY312_VENV)
	$(PY312_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PY312_VENV)/bin/python -m pip install --quiet --no-cache-dir -e ".[cloud,train,torch,dev]"
	touch $@

demo: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" bash scripts/demo.sh $(DEMO_DIR)

# After `make demo`: fine-tune macula-only on HbA1c (regression) and report its test MAE.
demo-hba1c: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" bash scripts/demo-hba1c.sh $(DEMO_DIR)

demo-cellpainting: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" bash scripts/demo-cellpainting.sh demo-cellpainting

lint: $(STAMP)
	$(BIN)/ruff check octstage octtrain tests bench scripts
	$(BIN)/ruff format --check octstage octtrain tests bench scripts
	$(BIN)/mypy

# The documentation site (mkdocs.yml, docs/): strict, so a broken link or an unlisted page fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test: lint docs
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest -m "not slow and not xla"

PEERS_STAMP := $(VENV)/.peers

# jump-portrait and cpgdata without their heavy or conflicting dependencies (see pyproject's peers).
$(PEERS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[peers-deps]"
	$(BIN)/python -m pip install --quiet --no-deps "jump-portrait==0.1.1" "cpgdata==0.6.0"
	touch $@

test-slow: $(PEERS_STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest -m "slow"

test-xla: $(XLA_STAMP)
	PJRT_DEVICE=CPU PATH="$(abspath $(XLA_VENV)/bin):$$PATH" $(XLA_VENV)/bin/pytest -m xla -p no:cacheprovider tests/xla

test-py312: $(PY312_STAMP)
	$(PY312_VENV)/bin/python --version
	PATH="$(abspath $(PY312_VENV)/bin):$$PATH" $(PY312_VENV)/bin/pytest -m "not slow and not xla" -p no:cacheprovider

bench: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" bash scripts/bench.sh

clean:
	rm -rf $(VENV) $(XLA_VENV) $(PY312_VENV) $(DEMO_DIR) demo-cellpainting site .mypy_cache .ruff_cache .pytest_cache
