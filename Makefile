# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test check lint docs docs-serve bench bench-peers clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) -e '.[dev,torch]'
	touch $@

# The documentation site's tools only (the docs extra: mkdocs, material, mkdocstrings), no
# training stack: mkdocstrings reads the sources statically (griffe), it imports nothing.
$(VENV)/.installed-docs: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) -e '.[docs]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/lanceloader demo

test: check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --quiet
	$(BIN)/python -m pytest

# The habits the code keeps, checked before the tests: lint, the formatter, the types of the rows
# protocol and the stages that read it (a member the protocol does not declare is an error), and
# the import contracts (stages point down; pyproject.toml [tool.importlinter]).
check: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# The documentation site into site/ (mkdocs.yml: strict, so a broken link or reference fails).
# Search needs a web server: view it with `make docs-serve`, or `python -m http.server -d site`.
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build

# The site at http://127.0.0.1:8000, search included, rebuilt on every change of docs/ or src/.
docs-serve: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

lint: check

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/throughput.py

# lanceloader against raw Lance and its peers (the bench extra: lancedb); rewrites
# docs/performance.md (~15 minutes)
bench-peers: $(VENV)/.installed-dev
	$(PIP) -e '.[dev,torch,bench]'
	$(BIN)/python benchmarks/peers.py

clean:
	rm -rf $(VENV) build dist site src/*.egg-info .pytest_cache .hypothesis .ruff_cache
