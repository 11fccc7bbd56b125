# "Attention, step by step" — everything runs inside .venv/ (created on first use).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
STAMP := $(VENV)/.installed

.PHONY: grade test build lab check clean venv train

## make grade: set up, regenerate the student notebooks, grade the demo class, print the table.
## The instructor's demo: to grade your own notebook, run `attn-course check <notebook>`. The build
## step refuses to overwrite a notebook in notebooks/ whose answers were edited (nothing is lost).
grade: $(STAMP)
	attn-course build
	attn-course demo --out build/demo

## make test: the whole test suite (CI runs this)
test: $(STAMP)
	python -m pytest

## make build: regenerate notebooks/ and the library code extracted from solutions/
## (BUILD_ARGS=--overwrite-student-work to replace notebooks whose answers were edited)
BUILD_ARGS ?=
build: $(STAMP)
	attn-course build $(BUILD_ARGS)

## make train: train the notebook-06 translator, evaluate it on the Multi30k test sets, record the
## results in results/translator.json (CONFIG=auto|gpu|cpu|quick, auto = gpu if CUDA is available; SRC, TGT)
CONFIG ?= auto
SRC ?= en
TGT ?= de
train: $(STAMP)
	attn-course train --config $(CONFIG) --src $(SRC) --tgt $(TGT) --evaluate --record

## make lab: JupyterLab on the student notebooks (LAB_ARGS="--no-browser --allow-root --port 8899"
## go to `jupyter lab` as they are)
LAB_ARGS ?=
lab: $(STAMP)
	attn-course lab $(LAB_ARGS)

venv: $(STAMP)

$(STAMP): requirements.txt constraints.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is needed: '$(PYTHON)' was not found. Install Python 3.11, or run 'make PYTHON=/path/to/python3.11'."; exit 1; }
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -r requirements.txt
	$(VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

clean:
	rm -rf build .pytest_cache
