#!/usr/bin/env bash
# One MLPerf BERT training run: check the variables a config_*.sh exported, drop the page cache
# when allowed, start `python -m bertperf train` on every rank, print the timing lines.
#
# `run_and_time.sh --check` only validates the configuration (no run, no timing lines): run by
# hand, the whole job the config describes (DGXNNODES x DGXNGPU ranks); under a launcher, as that
# launcher's rank sees it.
# Works three ways (README "Running"):
#   - as one task per rank, started by srun (run.sub), mpirun -np N, or torchrun --no_python:
#     the launcher's variables say so (read as the trainer reads them, below), and this script
#     runs one trainer process;
#   - once, on its own: it starts the ranks itself, DGXNNODES x DGXNGPU processes, with torchrun
#     (default; this node only), with mpirun (LAUNCHER=mpirun) or with srun inside a Slurm
#     allocation (LAUNCHER=srun).
# The MLPerf score is the run_start..run_stop interval of the MLPerf log (MLLOG_FILE); the RESULT
# line is the whole process's wall-clock time, as in NVIDIA's scripts, printed only for a run that
# ended by its rules (a killed or crashed run says that it failed).
set -euo pipefail

fail() { echo "run_and_time.sh: error: $*" >&2; exit 1; }

: "${BATCHSIZE:?set BATCHSIZE (source a config_*.sh first)}"
: "${GRADIENT_STEPS:?set GRADIENT_STEPS (source a config_*.sh first)}"
: "${LR:?set LR (source a config_*.sh first)}"
: "${MAX_STEPS:?set MAX_STEPS (source a config_*.sh first)}"
: "${DATADIR_PHASE2:?set DATADIR_PHASE2, the folder of training shards}"
: "${EVAL_FILE:?set EVAL_FILE, the eval set (eval_10k.hdf5)}"
: "${DGXNGPU:=1}"                  # ranks per node
: "${DGXNNODES:=1}"
: "${SEED:=${RANDOM}}"
: "${LOGDIR:=./results}"
: "${MLLOG_FILE:=${LOGDIR}/result_${SEED}.txt}"
: "${CLEAR_CACHES:=1}"
: "${LAUNCHER:=torchrun}"          # when starting the ranks: torchrun, mpirun or srun
: "${MAX_RESTARTS:=0}"             # torchrun: restarts from the newest checkpoint after a crash
: "${PYTHON:=python3}"
export SEED LOGDIR MLLOG_FILE
for var in DGXNNODES DGXNGPU; do
  [[ "${!var}" =~ ^[1-9][0-9]*$ ]] || fail "${var}=${!var} is not a positive whole number"
done
[[ "${MAX_RESTARTS}" =~ ^[0-9]+$ ]] || fail "MAX_RESTARTS=${MAX_RESTARTS} is not a whole number"
nproc=$(( DGXNNODES * DGXNGPU ))
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# the package from this checkout when it is not installed (pip install -e . / the container)
PYTHONPATH="${here}/implementations/pytorch${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONPATH

# This process's rank, world size and local rank, decided by the trainer's own reader
# (`bertperf rank`: torchrun's RANK, then OpenMPI's, then a Slurm step's). Asking it keeps one
# definition: the script and the trainer cannot disagree on which launcher's variables win.
dist=$("${PYTHON}" -m bertperf rank) || exit 1
read -r rank world local_rank <<< "${dist}"
if (( world > 1 )); then
  per_rank=1                      # a launcher started this script once per rank
else
  per_rank=0
fi

# The whole job's configuration as its rank 0 will see it: DGXNNODES x DGXNGPU ranks.
check_job() { RANK=0 WORLD_SIZE="${nproc}" LOCAL_RANK=0 "${PYTHON}" -m bertperf train --check; }

if [[ "${1:-}" == --check ]]; then   # validate the configuration only (run.sub does this first)
  if [[ "${per_rank}" == 1 ]]; then
    exec "${PYTHON}" -m bertperf train --check
  fi
  check_job
  exit 0
fi
if [[ "${per_rank}" == 0 && "${nproc}" -gt 1 ]]; then
  case "${LAUNCHER}" in
    torchrun) [[ "${DGXNNODES}" == 1 ]] || fail "LAUNCHER=torchrun starts the ranks of this" \
                "node only; DGXNNODES=${DGXNNODES} needs LAUNCHER=srun or LAUNCHER=mpirun" ;;
    mpirun|srun) ;;
    *) fail "LAUNCHER=${LAUNCHER} is not torchrun, mpirun or srun" ;;
  esac
  check_job >/dev/null            # a bad configuration: one line, no ranks started
fi

# Page cache: dropped once per node (local rank 0) unless run.sub already did it (CACHE_CLEAR).
if [[ -z "${CACHE_CLEAR:-}" ]]; then
  CACHE_CLEAR=0
  if [[ "${CLEAR_CACHES}" == 1 && "${local_rank}" == 0 ]]; then
    if "${here}/drop_caches.sh"; then
      CACHE_CLEAR=1
    else
      echo "run_and_time.sh: note: cannot drop the page cache here (not root, no sudo);" \
           "cache_clear is logged as false" >&2
    fi
  fi
fi
export CACHE_CLEAR

start_ns=$(date +%s.%N)           # also tells this run's MLPerf log from an older one
start=${start_ns%.*}
start_fmt=$(date -d "@${start}" +%Y-%m-%d\ %r)
if [[ "${rank}" == 0 ]]; then
  echo "STARTING TIMING RUN AT ${start_fmt}"
fi

train=("${PYTHON}" -u -m bertperf train)
# The preemption warning (SIGUSR1: from run.sub, or from Slurm to every process of the job) goes
# on to the trainer or its launcher, which checkpoint at a step the ranks agree on and exit 75.
child=""
trap '[[ -n "${child}" ]] && kill -USR1 "${child}" 2>/dev/null || true' USR1
start() {   # "$@" in the background, waited for through any number of warnings
  "$@" & child=$!
  local rc
  until wait "${child}"; do
    rc=$?
    kill -0 "${child}" 2>/dev/null || return "${rc}"
  done
}
status=0
if [[ "${per_rank}" == 1 || "${nproc}" == 1 ]]; then
  start "${train[@]}" || status=$?
else
  case "${LAUNCHER}" in
    torchrun)
      start "${PYTHON}" -m bertperf launch --nproc-per-node="${DGXNGPU}" \
        --max-restarts="${MAX_RESTARTS}" train || status=$? ;;
    mpirun)
      : "${MASTER_ADDR:=127.0.0.1}" "${MASTER_PORT:=29500}"
      export MASTER_ADDR MASTER_PORT
      read -ra mpirun_args <<< "${MPIRUN_ARGS:-}"   # e.g. "--allow-run-as-root --hostfile h"
      start mpirun -np "${nproc}" "${mpirun_args[@]}" -x MASTER_ADDR -x MASTER_PORT \
        "${train[@]}" || status=$? ;;
    srun)
      : "${SLURM_JOB_NODELIST:?LAUNCHER=srun needs a Slurm allocation}"
      : "${MASTER_ADDR:=$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 1)}"
      : "${MASTER_PORT:=29500}"
      export MASTER_ADDR MASTER_PORT
      start srun --ntasks="${nproc}" --ntasks-per-node="${DGXNGPU}" "${train[@]}" \
        || status=$? ;;
  esac
fi

end=$(date +%s)
if [[ "${rank}" == 0 ]]; then
  echo "ENDING TIMING RUN AT $(date +%Y-%m-%d\ %r)"
  # RESULT only for a run that ended by its rules: the MLPerf log it wrote after this script
  # started (not an older log of the same name) has run_stop (success, or aborted at
  # MAX_SAMPLES_TERMINATION / MAX_STEPS) and the trainer exited 0. A run that started training
  # and was killed or crashed says that it failed; one that failed before (no run_start) has
  # said why in its own error line.
  started=0
  if [[ -n "$(find "${MLLOG_FILE}" -newermt "@${start_ns}" 2>/dev/null)" ]] \
      && grep -q '"key": "run_start"' "${MLLOG_FILE}"; then
    started=1
  fi
  if [[ "${started}" == 1 && "${status}" == 0 ]] && grep -q '"key": "run_stop"' "${MLLOG_FILE}"
  then
    echo "RESULT,bert,${SEED},$(( end - start )),${USER:-$(id -un)},${start_fmt}"
  elif [[ "${status}" == 75 ]]; then
    echo "run_and_time.sh: the run stopped at the preemption warning, its checkpoint saved" \
         "(exit status 75; RESUME_FROM=auto continues it); no RESULT line" >&2
  elif [[ "${started}" == 1 ]]; then
    echo "run_and_time.sh: the run failed (exit status ${status}); no RESULT line" >&2
  fi
fi
exit "${status}"
