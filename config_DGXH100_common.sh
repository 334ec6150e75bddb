# shellcheck shell=bash
# Shared by every config_DGXH100_<nodes>x<gpus>x<batch>x<accum>.sh: the system, its training data
# and (config_common.sh) what no system or scale changes. Only exports; run_and_time.sh runs it.
# Paths are the host's; run.sub and run_with_docker.sh mount them into a container when CONT is set.

# The system (NVIDIA DGX H100: 8 H100 80GB GPUs, 2 sockets of 56 cores, SMT on)
export DGXNGPU=8
export DGXSOCKETCORES=56
export DGXNSOCKET=2
export DGXHT=2
export SUBMISSION_PLATFORM="${DGXNNODES:?set by the per-scale config}xNVIDIA DGX H100"

# shellcheck source=config_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/config_common.sh"

# The training data (data_prep/README.md): packed shards (`prep pack` of the unpadded ones: up to
# 3 sequences per 512-token row), trained as NVIDIA's H100 configs do (--packed_samples)
: "${DATADIR_PHASE2:=/raid/datasets/bert/packed}"
export DATADIR_PHASE2
export LAYOUT=packed        # fixed-shape rows
export PACKING_FACTOR=2     # global_batch_size = rows x 2, NVIDIA's --average_packing_rate

# FP8 (H100 and newer; bertperf.model.fp8): the encoder's 4 GEMMs a layer in FP8 (torchao's
# dynamic tensorwise recipe, E4M3 forward / E5M2 gradients), as NVIDIA's H100 submissions train
# them (with Transformer Engine). Off until a GPU run proves it, as COMPILE and USE_CUDA_GRAPH
# stay off: FP8=1 turns it on. The A100 configs do not set it (refused below sm_89).
: "${FP8:=0}"
export FP8
