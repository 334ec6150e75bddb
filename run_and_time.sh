#!/usr/bin/env bash
# One MLPerf BERT training run: check the variables a config_*.sh exported, drop the page cache
# when allowed, start `python -m bertperf train` on every rank, print the timing lines.
#
# `run_and_time.sh --check` only validates the configuration (no run, no timing lines).
# Works three ways (README "Running"):
#   - as one task per rank, started by srun (run.sub), mpirun -np N, or torchrun --no_python:
#     the launcher's variables (SLURM_PROCID, OMPI_COMM_WORLD_RANK, RANK) say so, and this
#     script runs one trainer process;
#   - once, on its own: it starts the ranks itself, DGXNGPU processes on this node, with
#     torchrun (default), with mpirun (LAUNCHER=mpirun) or with srun inside a Slurm allocation
#     (LAUNCHER=srun).
# The MLPerf score is the run_start..run_stop interval of the MLPerf log (MLLOG_FILE); the RESULT
# line is the whole process's wall-clock time, as in NVIDIA's scripts.
set -euo pipefail

: "${BATCHSIZE:?set BATCHSIZE (source a config_*.sh first)}"
: "${GRADIENT_STEPS:?set GRADIENT_STEPS (source a config_*.sh first)}"
: "${LR:?set LR (source a config_*.sh first)}"
: "${MAX_STEPS:?set MAX_STEPS (source a config_*.sh first)}"
: "${DATADIR_PHASE2:?set DATADIR_PHASE2, the folder of training shards}"
: "${EVAL_FILE:?set EVAL_FILE, the eval set (eval_10k.hdf5)}"
: "${DGXNGPU:=1}"                  # ranks per node when this script starts them
: "${DGXNNODES:=1}"
: "${SEED:=${RANDOM}}"
: "${LOGDIR:=./results}"
: "${MLLOG_FILE:=${LOGDIR}/result_${SEED}.txt}"
: "${CLEAR_CACHES:=1}"
: "${LAUNCHER:=torchrun}"          # when starting the ranks: torchrun, mpirun or srun
: "${PYTHON:=python3}"
export SEED LOGDIR MLLOG_FILE
# the package from this checkout when it is not installed (pip install -e . / the container)
PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/implementations/pytorch${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONPATH

if [[ "${1:-}" == --check ]]; then   # validate the configuration only (run.sub does this first)
  exec "${PYTHON}" -m bertperf train --check
fi

rank="${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-${RANK:-}}}"
world="${SLURM_NTASKS:-${OMPI_COMM_WORLD_SIZE:-${WORLD_SIZE:-1}}}"
local_rank="${SLURM_LOCALID:-${OMPI_COMM_WORLD_LOCAL_RANK:-${LOCAL_RANK:-0}}}"
if [[ -n "${rank}" && "${world}" -gt 1 ]]; then
  per_rank=1                      # a launcher started this script once per rank
else
  per_rank=0
  rank=0
fi

# Page cache: dropped once per node (local rank 0) unless run.sub already did it (CACHE_CLEAR).
if [[ -z "${CACHE_CLEAR:-}" ]]; then
  CACHE_CLEAR=0
  if [[ "${CLEAR_CACHES}" == 1 && "${local_rank}" == 0 ]]; then
    if sync && { sysctl -q vm.drop_caches=3 || sudo -n /sbin/sysctl -q vm.drop_caches=3; } \
        >/dev/null 2>&1; then
      CACHE_CLEAR=1
    else
      echo "run_and_time.sh: note: cannot drop the page cache here (not root, no sudo);" \
           "cache_clear is logged as false" >&2
    fi
  fi
fi
export CACHE_CLEAR

start=$(date +%s)
start_fmt=$(date +%Y-%m-%d\ %r)
[[ "${rank}" == 0 ]] && echo "STARTING TIMING RUN AT ${start_fmt}"

train=("${PYTHON}" -u -m bertperf train)
nproc=$(( DGXNGPU * DGXNNODES ))
status=0
if [[ "${per_rank}" == 1 || "${nproc}" == 1 ]]; then
  "${train[@]}" || status=$?
elif ! RANK=0 WORLD_SIZE="${nproc}" "${train[@]}" --check >/dev/null; then
  status=1                        # a bad configuration: one line above, no ranks started
else
  case "${LAUNCHER}" in
    torchrun)
      "${PYTHON}" -m torch.distributed.run --standalone --nproc_per_node="${DGXNGPU}" \
        -m bertperf train || status=$? ;;
    mpirun)
      : "${MASTER_ADDR:=127.0.0.1}" "${MASTER_PORT:=29500}"
      export MASTER_ADDR MASTER_PORT
      read -ra mpirun_args <<< "${MPIRUN_ARGS:-}"   # e.g. "--allow-run-as-root --hostfile h"
      mpirun -np "${nproc}" "${mpirun_args[@]}" -x MASTER_ADDR -x MASTER_PORT "${train[@]}" \
        || status=$? ;;
    srun)
      : "${SLURM_JOB_NODELIST:?LAUNCHER=srun needs a Slurm allocation}"
      : "${MASTER_ADDR:=$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 1)}"
      : "${MASTER_PORT:=29500}"
      export MASTER_ADDR MASTER_PORT
      srun --ntasks="${nproc}" --ntasks-per-node="${DGXNGPU}" "${train[@]}" || status=$? ;;
    *)
      echo "run_and_time.sh: error: LAUNCHER=${LAUNCHER} is not torchrun, mpirun or srun" >&2
      exit 2 ;;
  esac
fi

end=$(date +%s)
if [[ "${rank}" == 0 ]]; then
  echo "ENDING TIMING RUN AT $(date +%Y-%m-%d\ %r)"
  echo "RESULT,bert,${SEED},$(( end - start )),${USER:-$(id -un)},${start_fmt}"
fi
exit "${status}"
