# shellcheck shell=bash
# Sourced by every system's config_<SYSTEM>_common.sh (DGX A100, DGX H100), as NVIDIA's configs
# source a common file: the eval set, the initial checkpoint, the model and the recipe parts every
# system and scale shares. Only exports.

# The data (data_prep/README.md): the 10,000-sample eval set and MLPerf's initial checkpoint (TF1
# prefix, read without TensorFlow; or a convert-ckpt .pt)
: "${EVAL_FILE:=/raid/datasets/bert/eval/eval_10k.hdf5}"
: "${INIT_CHECKPOINT:=/raid/datasets/bert/phase1/model.ckpt-28252}"
export EVAL_FILE INIT_CHECKPOINT
export BERT_CONFIG=large

# The recipe parts every system and scale shares (MLPerf's accuracy target and eval cadence are
# left to the trainer, whose defaults they are)
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
