# shellcheck shell=bash
# 32 DGX A100 node(s) x 8 GPUs x 24 sequences x 1 accumulation = global batch 6144.
# Hyperparameters: the ruleset 5.0.0 reference convergence point for this batch (RCP row BS 6144).
# Evals: the trainer's default, MLPerf's cadence for this batch. WALLTIME budgets 8 min per
# run (NEXP runs in one allocation) + 5 min of setup; not yet measured on A100 hardware.
export DGXNNODES=32
# shellcheck source=config_DGXA100_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/config_DGXA100_common.sh"

export BATCHSIZE=24
export GRADIENT_STEPS=1
export LR=0.0029293
export MAX_STEPS=700
export WARMUP_STEPS=0
export START_WARMUP_STEP=-700
export OPT_LAMB_BETA_1=0.7206
export OPT_LAMB_BETA_2=0.78921
export WEIGHT_DECAY_RATE=0.001
export MAX_SAMPLES_TERMINATION=5000000

: "${NEXP:=10}"
WALLTIME_MINUTES=8
export WALLTIME=$(( NEXP * WALLTIME_MINUTES + 5 ))
