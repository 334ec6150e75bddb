#!/usr/bin/env bash
# NEXP MLPerf BERT runs on one node in a Docker container (README "Running"):
#
#   CONT=bertperf:latest DGXSYSTEM=DGXA100_1x8x56x1 NEXP=10 ./run_with_docker.sh
#
# Sources config_${DGXSYSTEM}.sh (NEXP defaults to the config's), starts one container with the
# data, the initial checkpoint and LOGDIR mounted at fixed paths, and per run drops the page cache
# (drop_caches.sh, when allowed) and runs run_and_time.sh inside it, which starts DGXNGPU ranks
# with torchrun. Console output goes to LOGDIR/<DATESTAMP>_<i>.log, the MLPerf log to
# LOGDIR/result_<DATESTAMP>_<i>.txt. Any engine with docker's CLI: DOCKER=podman, or the docker
# client on `podman system service` (DOCKER_HOST=unix://...), as `make container-test` runs it.
set -euo pipefail

: "${CONT:?set CONT, the container image (docker build -t bertperf:latest .)}"
: "${DGXSYSTEM:?set DGXSYSTEM, e.g. DGXA100_1x8x56x1 for config_DGXA100_1x8x56x1.sh}"
: "${CLEAR_CACHES:=1}"
: "${DATESTAMP:=$(date +%y%m%d%H%M%S%N)}"
: "${LOGDIR:=$(pwd)/results}"
: "${CONFIG_FILE:=./config_${DGXSYSTEM}.sh}"
: "${CONT_NAME:=bertperf_${DATESTAMP}}"
: "${DOCKER:=docker}"

fail() { echo "run_with_docker.sh: error: $*" >&2; exit 1; }
[[ -f "${CONFIG_FILE}" ]] || fail "${CONFIG_FILE}: no such config file"
# shellcheck source=/dev/null
source "${CONFIG_FILE}"
: "${NEXP:?set NEXP, the number of runs (the config sets a default)}"
: "${DGXNGPU:?the config must set DGXNGPU}"
: "${DATADIR_PHASE2:?the config must set DATADIR_PHASE2}"
: "${EVAL_FILE:?the config must set EVAL_FILE}"
[[ -d "${DATADIR_PHASE2}" ]] || fail "DATADIR_PHASE2 ${DATADIR_PHASE2}: no such folder"
[[ -f "${EVAL_FILE}" ]] || fail "EVAL_FILE ${EVAL_FILE}: no such file"
# mount sources as absolute paths (a relative one, as the CPU config's default, would name a volume)
DATADIR_PHASE2=$(realpath "${DATADIR_PHASE2}")
EVAL_FILE=$(realpath "${EVAL_FILE}")
LOGDIR=$(realpath -m "${LOGDIR}")
[[ -z "${INIT_CHECKPOINT:-}" ]] || INIT_CHECKPOINT=$(realpath -m "${INIT_CHECKPOINT}")
"${DOCKER}" image inspect "${CONT}" >/dev/null 2>&1 \
  || fail "container image ${CONT}: not found (docker build -t ${CONT} . or docker pull it)"
if ! mkdir -p "${LOGDIR}" 2>/dev/null || [[ ! -w "${LOGDIR}" ]]; then
  fail "LOGDIR ${LOGDIR}: not writable"
fi

mounts=(-v "${DATADIR_PHASE2}:/workspace/data_phase2:ro"
        -v "$(dirname "${EVAL_FILE}"):/workspace/evaldata:ro" -v "${LOGDIR}:/results")
inside=(DATADIR_PHASE2=/workspace/data_phase2 "EVAL_FILE=/workspace/evaldata/$(basename "${EVAL_FILE}")"
        LOGDIR=/results)
if [[ -n "${INIT_CHECKPOINT:-}" ]]; then
  mounts+=(-v "$(dirname "${INIT_CHECKPOINT}"):/workspace/phase1:ro")
  inside+=("INIT_CHECKPOINT=/workspace/phase1/$(basename "${INIT_CHECKPOINT}")")
fi

# Every variable the config exports goes into the container (paths replaced by `inside`).
mapfile -t config_vars < <(env -i bash -c "set -a; source '${CONFIG_FILE}'; compgen -e" \
                           | grep -vxE 'PWD|SHLVL|_|OLDPWD')
env_args=()
for assignment in "${inside[@]}"; do
  env_args+=(--env "${assignment}")
done
for var in "${config_vars[@]}"; do
  [[ " ${inside[*]%%=*} " == *" ${var} "* ]] || env_args+=(--env "${var}=${!var}")
done

# NVIDIA's options for a GPU run: every GPU, unlimited locked memory (pinned buffers, RDMA), a
# 64 MB stack. A CPU config (DEVICE=cpu) needs none of them, and where the runtime may not raise
# those limits (podman/runc on a VM) it runs with the engine's defaults.
gpu_args=(--gpus all --ulimit=stack=67108864 --ulimit=memlock=-1)
[[ "${DEVICE:-cuda}" == cpu ]] && gpu_args=()
"${DOCKER}" run --rm --init --detach "${gpu_args[@]}" --net=host --uts=host --ipc=host \
  --name="${CONT_NAME}" "${mounts[@]}" "${CONT}" sleep infinity >/dev/null
trap '"${DOCKER}" rm -f "${CONT_NAME}" >/dev/null 2>&1 || true' EXIT

for i in $(seq 1 "${NEXP}"); do
  log="${LOGDIR}/${DATESTAMP}_${i}.log"
  echo "Beginning trial ${i} of ${NEXP}" | tee "${log}"
  cache_clear=0
  if [[ "${CLEAR_CACHES}" == 1 ]]; then
    if "$(dirname "${BASH_SOURCE[0]}")/drop_caches.sh"; then
      cache_clear=1
    else
      echo "run_with_docker.sh: note: cannot drop the page cache; cache_clear logged as false" \
        | tee -a "${log}"
    fi
  fi
  if [[ -n "${SEED:-}" ]]; then seed=$(( SEED + i - 1 )); else seed=${RANDOM}; fi
  "${DOCKER}" exec "${env_args[@]}" --env "CACHE_CLEAR=${cache_clear}" --env "SEED=${seed}" \
    --env "MLLOG_FILE=/results/result_${DATESTAMP}_${i}.txt" --env LAUNCHER=torchrun \
    "${CONT_NAME}" ./run_and_time.sh 2>&1 | tee -a "${log}" || true
done
