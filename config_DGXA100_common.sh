# shellcheck shell=bash
# Shared by every config_DGXA100_<nodes>x8x<batch>x<accum>.sh: the system, its training data and
# (config_common.sh) what no system or scale changes. Only exports; run_and_time.sh runs it.
# Paths are the host's; run.sub and run_with_docker.sh mount them into a container when CONT is set.

# The system (NVIDIA DGX A100: 8 GPUs, 2 sockets of 64 cores, SMT on)
export DGXNGPU=8
export DGXSOCKETCORES=64
export DGXNSOCKET=2
export DGXHT=2
export SUBMISSION_PLATFORM="${DGXNNODES:?set by the per-scale config}xNVIDIA DGX A100"

# shellcheck source=config_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/config_common.sh"

# The training data (data_prep/README.md): unpadded shards
: "${DATADIR_PHASE2:=/raid/datasets/bert/unpadded}"
export DATADIR_PHASE2
