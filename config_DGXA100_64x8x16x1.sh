# shellcheck shell=bash
# 64 DGX A100 node(s) x 8 GPUs x 16 sequences x 1 accumulation = global batch 8192.
# Hyperparameters: the ruleset 5.0.0 reference convergence point for this batch (RCP row BS 8192).
# Evals: the trainer's default, MLPerf's cadence for this batch. WALLTIME budgets 6 min per
# run (NEXP runs in one allocation) + 5 min of setup; not yet measured on A100 hardware.
export DGXNNODES=64
# shellcheck source=config_DGXA100_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/config_DGXA100_common.sh"

export BATCHSIZE=16
export GRADIENT_STEPS=1
export LR=0.00288293
export MAX_STEPS=600
export WARMUP_STEPS=287
export START_WARMUP_STEP=-76
export OPT_LAMB_BETA_1=0.88
export OPT_LAMB_BETA_2=0.88
export WEIGHT_DECAY_RATE=0.0166629
export MAX_SAMPLES_TERMINATION=7000000

: "${NEXP:=10}"
WALLTIME_MINUTES=6
export WALLTIME=$(( NEXP * WALLTIME_MINUTES + 5 ))
