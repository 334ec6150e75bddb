# bertperf: `make demo` (set up and run the default job), `make test` (set up and run all tests).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
WIKI_SAMPLE ?= ../shared/data/wiki_sample
OUT ?= out
# torch: the CPU build is pinned and installed first, so that `torch>=2.4` in pyproject.toml is
# already met (a bare `torch` would download a multi-GB CUDA build). GPU machines bring their own.
TORCH_CPU ?= torch==2.13.0

.PHONY: setup system-deps test test-fast demo bench-prep lint clean

setup: system-deps $(VENV)/.installed

# OpenMPI for the MPI paths (installed when running as root on Debian/Ubuntu; tests skip without it).
system-deps:
	@command -v mpirun >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev shellcheck >/dev/null; \
	  else echo "note: OpenMPI (mpirun) not found; MPI tests will be skipped"; fi; }

$(VENV)/.installed: pyproject.toml setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install -q '$(TORCH_CPU)'
	$(PY) -m pip install -q -e '.[test]'
	touch $@

test: setup
	$(PY) -m pytest -q tests

test-fast: setup
	$(PY) -m pytest -q tests -m "not slow"

# The default job: the full data-prep chain on the Wikipedia sample (training joins in a later issue).
demo: setup
	PYTHON=$(PY) WIKI_DIR=$(WIKI_SAMPLE) OUT_DIR=$(OUT)/wiki_sample NUM_EVAL_ARTICLES=40 \
	  BLOCK_SIZE=1.0 NUM_PARTS=4 NUM_EVAL_SAMPLES=1000 bash data_prep/prepare_data.sh

bench-prep: setup
	$(PY) -m bertperf bench prep

lint:
	shellcheck data_prep/*.sh .ci/run

clean:
	rm -rf build $(OUT) implementations/pytorch/bertperf/prep/*.so
