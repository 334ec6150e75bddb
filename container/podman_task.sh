#!/usr/bin/env bash
# One Slurm task in its own podman container of the image (run.sub with CONTAINER_RUNTIME=podman,
# where a cluster has no pyxis): srun starts this script per task, it runs the given command in
# CONT with run.sub's mounts (CONT_MOUNTS, pyxis's src:dst[:ro],... list) and working directory.
# The environment is passed as pyxis passes it: every variable of the task, where the image sets
# one (PATH, LD_LIBRARY_PATH, ...) the image's value wins. Host network, IPC and UTS namespaces:
# the ranks meet at MASTER_ADDR:MASTER_PORT as on bare metal.
set -euo pipefail

: "${CONT:?set CONT, the container image}"
: "${CONT_MOUNTS:?set CONT_MOUNTS, src:dst[:ro],... as run.sub makes it}"
: "${CONT_WORKDIR:=/workspace/bert}"
: "${PODMAN:=podman}"

mounts=()
IFS=, read -ra list <<< "${CONT_MOUNTS}"
for mount in "${list[@]}"; do
  mounts+=(-v "${mount}")
done
image_env=()
while IFS= read -r assignment; do
  [[ -n "${assignment}" ]] && image_env+=(--env "${assignment}")
done < <("${PODMAN}" image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "${CONT}")
gpu_args=(--gpus all)
[[ "${DEVICE:-cuda}" == cpu ]] && gpu_args=()

exec "${PODMAN}" run --rm --net=host --ipc=host --uts=host "${gpu_args[@]}" "${mounts[@]}" \
  --env-host "${image_env[@]}" --workdir "${CONT_WORKDIR}" "${CONT}" "$@"
