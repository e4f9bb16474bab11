# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test lint docs bench bench-peers clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) -e '.[dev,torch]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/lanceloader demo

test: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks examples
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --quiet
	$(BIN)/python -m pytest

# The documentation site into site/ (mkdocs.yml: strict, so a broken link or reference fails).
docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/throughput.py

# lanceloader against raw Lance and its peers (the bench extra: lancedb); rewrites
# docs/performance.md (~15 minutes)
bench-peers: $(VENV)/.installed-dev
	$(PIP) -e '.[dev,torch,bench]'
	$(BIN)/python benchmarks/peers.py

clean:
	rm -rf $(VENV) build dist site src/*.egg-info .pytest_cache .hypothesis .ruff_cache
