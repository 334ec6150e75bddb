# The bertperf image for run.sub (pyxis/enroot) and run_with_docker.sh: NGC PyTorch (CUDA, NCCL,
# OpenMPI, cuDNN, FlashAttention-capable torch) plus this package and its pinned requirements.
# Build: docker build -t bertperf:latest .   (no Docker engine in CI: tests lint this file and run
# what it runs - the pip install of the package, run_and_time.sh - outside of it)
ARG FROM_IMAGE_NAME=nvcr.io/nvidia/pytorch:25.04-py3
FROM ${FROM_IMAGE_NAME}

WORKDIR /workspace/bert

# The package first (layer cache: scripts change more often than dependencies). The image's own
# torch satisfies `torch>=2.4`; pip installs the pinned rest (pyproject.toml: DL3013 does not
# apply to a local package) and builds the C extension.
COPY pyproject.toml setup.py README.md ./
COPY implementations ./implementations
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[mpi]" \
 && python -m bertperf --help > /dev/null

COPY run_and_time.sh drop_caches.sh run.sub run_with_docker.sh config_*.sh ./
COPY data_prep ./data_prep
COPY compliance ./compliance

ENV OMP_NUM_THREADS=1
