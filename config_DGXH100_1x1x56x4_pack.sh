# shellcheck shell=bash
# One H100 (80 GB) of a DGX H100, packed rows as NVIDIA's H100 configs train: 1 GPU x 56 rows x 4
# micro-batches = 224 rows of 512 tokens a step, about 448 sequences (MLPerf's packed data holds
# 1.999 per row), logged as global batch 448 = 224 x PACKING_FACTOR 2 (NVIDIA's accounting), so
# the hyperparameters are the ruleset 5.0.0 RCP row BS 448's. Samples are counted as the sequences
# trained. Evals: the trainer's default, MLPerf's cadence for this batch. WALLTIME budgets 120 min
# per run (an estimate: not yet measured end to end).
export DGXNNODES=1
# shellcheck source=config_DGXH100_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/config_DGXH100_common.sh"
export DGXNGPU=1                  # one GPU of the node, not the whole DGX
export SUBMISSION_PLATFORM="1xNVIDIA H100 80GB"

export BATCHSIZE=56
export GRADIENT_STEPS=4
export LR=0.000425
export MAX_STEPS=6700
export WARMUP_STEPS=0
export START_WARMUP_STEP=0
export OPT_LAMB_BETA_1=0.9
export OPT_LAMB_BETA_2=0.999
export WEIGHT_DECAY_RATE=0.01
export MAX_SAMPLES_TERMINATION=4500000

: "${NEXP:=10}"
WALLTIME_MINUTES=120
export WALLTIME=$(( NEXP * WALLTIME_MINUTES + 5 ))
