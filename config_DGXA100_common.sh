# shellcheck shell=bash
# Shared by every config_DGXA100_<nodes>x8x<batch>x<accum>.sh: the system, the data locations and
# what does not change with scale. Only exports; run_and_time.sh checks and starts the run.
# Paths are the host's; run.sub and run_with_docker.sh mount them into a container when CONT is set.

# The system (NVIDIA DGX A100: 8 GPUs, 2 sockets of 64 cores, SMT on)
export DGXNGPU=8
export DGXSOCKETCORES=64
export DGXNSOCKET=2
export DGXHT=2
export SUBMISSION_PLATFORM="${DGXNNODES:?set by the per-scale config}xNVIDIA DGX A100"

# The data (data_prep/README.md): unpadded training shards, the 10,000-sample eval set and
# MLPerf's initial checkpoint (TF1 prefix, read without TensorFlow; or a convert-ckpt .pt)
: "${DATADIR_PHASE2:=/raid/datasets/bert/unpadded}"
: "${EVAL_FILE:=/raid/datasets/bert/eval/eval_10k.hdf5}"
: "${INIT_CHECKPOINT:=/raid/datasets/bert/phase1/model.ckpt-28252}"
export DATADIR_PHASE2 EVAL_FILE INIT_CHECKPOINT
export BERT_CONFIG=large

# The recipe parts every scale shares (MLPerf's accuracy target and eval cadence are left to
# the trainer, whose defaults they are)
export PRECISION=bf16
export EVAL_BATCHSIZE=128
export EPSILON=1e-6
export MAX_GRAD_NORM=1.0
# 1: each rank clips its gradient bucket by bucket before DDP's all-reduce, which then overlaps
# backward; 0 (default): the global norm is clipped after the all-reduce
: "${CLIP_BEFORE_ALLREDUCE:=0}"
export CLIP_BEFORE_ALLREDUCE
# 1: LAMB's state sharded over the ranks (ZeRO-1); MLPerf's reference replicates it
: "${SHARDED_LAMB:=0}"
export SHARDED_LAMB
# Load balance across ranks (the reference's defaults, 0 and unset): BALANCE=1 places each global
# batch's samples so that every rank gets the same tokens (data/balance.py); DATADIR_PHASE2 set to
# a `prep stratify` output trains LAYOUT=stratified (every rank's batch drawn from each length bin)
: "${BALANCE:=0}"
export BALANCE
export LOG_FREQ=50
