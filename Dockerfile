# The bertperf image for run.sub and run_with_docker.sh: NGC PyTorch (CUDA, NCCL, OpenMPI, cuDNN,
# FlashAttention-capable torch) plus this package and what the base lacks of its requirements
# (data preparation, the MLPerf logger and checkers), the launch scripts in the working directory.
#   docker build -t bertperf:latest .
# Another base: --build-arg FROM_IMAGE_NAME=<image with python, pip and torch 2.10 to 2.13>; a base
# without torch takes the wheel in the build context's .whl/ (container/build.sh: plain Debian).
# --build-arg EXTRAS=mpi leaves torchao (FP8=1) out; EXTRAS=mpi,fp8,tensorboard adds
# TENSORBOARD=1's package.
# NGC 25.12 (NVIDIA's release notes): torch 2.10.0a0+b4e4ee81d3, CUDA 13.1.0, Python 3.12.
ARG FROM_IMAGE_NAME=nvcr.io/nvidia/pytorch:25.12-py3
FROM ${FROM_IMAGE_NAME}

WORKDIR /workspace/bert

# torch is the base's, never resolved, replaced or downgraded: nothing below asks pip for it, and
# container/requirements.py pins it, triton and numpy at the base's versions, while NGC's own
# constraints (/etc/pip/constraint.txt through PIP_CONSTRAINT) pin everything else the base has.
# Only a base without torch installs one, from the context's .whl/ (never an index's CUDA build;
# the glob matches nothing in a context without that folder, pyproject.toml always). torch is
# looked for, not imported: an import could write bytecode into the base's torch.
COPY pyproject.toml .wh[l]/torch-*.whl /tmp/wheels/
RUN python -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)' \
 || pip install --no-cache-dir /tmp/wheels/torch-*.whl \
 && rm -rf /tmp/wheels

# Layer cache: the requirements (from pyproject.toml: DL3013 does not apply) change less often
# than the package, which changes less often than the scripts. requirements.py stops the build in
# one line when the base's torch is outside the supported lines.
ARG EXTRAS=mpi,fp8
COPY pyproject.toml ./
COPY container/requirements.py container/
COPY implementations/pytorch/bertperf/__init__.py implementations/pytorch/bertperf/errors.py \
     implementations/pytorch/bertperf/versions.py implementations/pytorch/bertperf/
# hadolint ignore=DL3013
RUN python container/requirements.py --extras "${EXTRAS}" --out /tmp/requirements \
 && pip install --no-cache-dir -r /tmp/requirements/requirements.txt \
      -c /tmp/requirements/constraints.txt \
 && rm -rf /tmp/requirements
# The package alone (--no-deps: it changes nothing installed), with its C extension where the
# base has a compiler (pure Python otherwise, same output). The base's constraints are lifted for
# this one install: they would reach the throwaway environment pip builds it in, whose setuptools
# must be 77 or newer (pyproject.toml), while the base's may pin an older one.
COPY README.md ./
COPY implementations ./implementations
# hadolint ignore=DL3013
RUN PIP_CONSTRAINT="" pip install --no-cache-dir --no-deps --force-reinstall . \
 && python -m bertperf --help > /dev/null

COPY run_and_time.sh drop_caches.sh run.sub run_with_docker.sh config_*.sh ./
COPY data_prep ./data_prep
COPY compliance ./compliance

ENV OMP_NUM_THREADS=1
