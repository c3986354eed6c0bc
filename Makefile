# Two commands do all the set-up on a fresh machine:
#   make demo   -- install, then run the Prefect training flow (2-worker LocalCluster) on the bundled UMLS graph
#   make test   -- install, then run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint install clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/kgpipe train -c configs/umls-complex.yaml --set distributed.workers=2

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=30

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check kgpipe tests bench flows tasks
	$(BIN)/ruff format --check kgpipe tests bench flows tasks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs .pytest_cache
