# The bertperf image for run.sub and run_with_docker.sh: NGC PyTorch (CUDA, NCCL, OpenMPI, cuDNN,
# FlashAttention-capable torch) plus this package and its pinned requirements (data preparation,
# the MLPerf logger and checkers), the launch scripts in the working directory.
#   docker build -t bertperf:latest .
# Any base with `python` and `pip` on its PATH builds as well: container/build.sh makes a plain
# Debian one (debootstrap + podman import) and builds on it with --build-arg FROM_IMAGE_NAME=...
ARG FROM_IMAGE_NAME=nvcr.io/nvidia/pytorch:25.04-py3
FROM ${FROM_IMAGE_NAME}

WORKDIR /workspace/bert

# torch: the base's own (NGC's CUDA build: it must be 2.11-2.13, pyproject.toml's range, or pip
# replaces it with PyPI's below; pass such a base as FROM_IMAGE_NAME); a base without one takes
# the wheel from the build context's .whl/ folder (container/build.sh puts the CPU build there),
# never an index's CUDA build. The glob matches nothing in a context without that folder;
# pyproject.toml always.
COPY pyproject.toml .wh[l]/torch-*.whl /tmp/wheels/
RUN python -c 'import torch' 2>/dev/null \
 || pip install --no-cache-dir /tmp/wheels/torch-*.whl \
 && rm -rf /tmp/wheels

# Layer cache: the pinned requirements (pyproject.toml: DL3013 does not apply to a local package)
# change less often than the package, which changes less often than the scripts. The first
# install has no sources yet (an empty package and README: its dependencies only); the second
# builds the package and its C extension where the base has a compiler (pure Python otherwise,
# same output).
COPY pyproject.toml setup.py ./
# fp8: torchao (FP8=1), imported only by runs that ask for FP8.
# hadolint ignore=DL3013
RUN mkdir -p implementations/pytorch && touch README.md && pip install --no-cache-dir ".[mpi,fp8]"
COPY README.md ./
COPY implementations ./implementations
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --no-deps --force-reinstall . \
 && python -m bertperf --help > /dev/null

COPY run_and_time.sh drop_caches.sh run.sub run_with_docker.sh config_*.sh ./
COPY data_prep ./data_prep
COPY compliance ./compliance

ENV OMP_NUM_THREADS=1
