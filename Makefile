# marl: `make install` once, then `make train` (the embedded default run) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0

.PHONY: install train test test-all lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==$(TORCH_VERSION)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(BIN)/marl train experiment=embedded $(ARGS)

test: $(STAMP)
	$(BIN)/pytest -q

test-all: $(STAMP)
	$(BIN)/pytest -q -m "slow or not slow"

lint: $(STAMP)
	$(BIN)/ruff check marl_cli tests bench

bench: $(STAMP)
	$(BIN)/python bench/run.py --out bench/report.json

clean:
	rm -rf outputs/*/ multirun/*/ .pytest_cache .ruff_cache
