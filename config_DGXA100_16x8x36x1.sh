# shellcheck shell=bash
# 16 DGX A100 node(s) x 8 GPUs x 36 sequences x 1 accumulation = global batch 4608.
# Hyperparameters: the ruleset 5.0.0 reference convergence point for this batch (RCP row BS 4608).
# Evals: the trainer's default, MLPerf's cadence for this batch. WALLTIME budgets 10 min per
# run (NEXP runs in one allocation) + 5 min of setup; not yet measured on A100 hardware.
export DGXNNODES=16
# shellcheck source=config_DGXA100_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/config_DGXA100_common.sh"

export BATCHSIZE=36
export GRADIENT_STEPS=1
export LR=0.0035
export MAX_STEPS=700
export WARMUP_STEPS=0
export START_WARMUP_STEP=0
export OPT_LAMB_BETA_1=0.62
export OPT_LAMB_BETA_2=0.9
export WEIGHT_DECAY_RATE=0.01
export MAX_SAMPLES_TERMINATION=4500000

: "${NEXP:=10}"
WALLTIME_MINUTES=10
export WALLTIME=$(( NEXP * WALLTIME_MINUTES + 5 ))
