# simbatch — every target installs what it needs first, so each works on a fresh machine with python3.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test validate validate-quick bench notebooks lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: install
	$(BIN)/simbatch run scenarios/oversubscribed.yaml

lint: install
	$(BIN)/ruff check simbatch tests benchmarks scripts

# The tests run on two workers (pytest-xdist; the machines have two cores); TEST_WORKERS=0 runs them in
# one process. Tests marked with one xdist_group run on one worker, so a costly fixture they share is
# made once. The statistical validation (tests/validation) is kept apart from the tests: `make
# validate-quick` runs it with few replications (CI runs it after `make test`); `make validate` runs it
# in full and rewrites docs/validation.md, in one process: its report is written from the whole session
# (it spreads its replications over a process pool itself).
TEST_WORKERS ?= 2
# The workers, notebook kernels and CLI subprocesses import the same modules: byte-code caches (in the
# ignored __pycache__ folders) let all but the first skip compiling them, even where the environment
# sets PYTHONDONTWRITEBYTECODE.

test: install lint
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --ignore=tests/validation

validate-quick: install
	PYTHONDONTWRITEBYTECODE= SIMBATCH_VALIDATION=quick $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup tests/validation

validate: install
	SIMBATCH_VALIDATION=full $(BIN)/python -m pytest tests/validation -m validation

bench: install
	$(BIN)/python -m benchmarks.run

notebooks: install
	$(BIN)/python scripts/run_notebooks.py

clean:
	rm -rf $(VENV) results .pytest_cache .ruff_cache
