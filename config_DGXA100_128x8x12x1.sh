# shellcheck shell=bash
# 128 DGX A100 node(s) x 8 GPUs x 12 sequences x 1 accumulation = global batch 12288.
# Hyperparameters: the ruleset 5.0.0 reference convergence point for this batch (RCP row BS 12288).
# Evals: the trainer's default, MLPerf's cadence for this batch. WALLTIME budgets 5 min per
# run (NEXP runs in one allocation) + 5 min of setup; not yet measured on A100 hardware.
export DGXNNODES=128
# shellcheck source=config_DGXA100_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/config_DGXA100_common.sh"

export BATCHSIZE=12
export GRADIENT_STEPS=1
export LR=0.0031
export MAX_STEPS=500
export WARMUP_STEPS=300
export START_WARMUP_STEP=-100
export OPT_LAMB_BETA_1=0.80
export OPT_LAMB_BETA_2=0.925
export WEIGHT_DECAY_RATE=0.0166629
export MAX_SAMPLES_TERMINATION=12000000

: "${NEXP:=10}"
WALLTIME_MINUTES=5
export WALLTIME=$(( NEXP * WALLTIME_MINUTES + 5 ))
