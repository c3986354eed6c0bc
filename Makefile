# Two commands do all the set-up on a fresh machine:
#   make demo   -- install, then train ComplEx on the bundled UMLS graph end to end
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
	$(BIN)/kgpipe train -c configs/umls-complex.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check kgpipe tests bench
	$(BIN)/ruff format --check kgpipe tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs .pytest_cache
