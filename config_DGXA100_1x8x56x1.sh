# shellcheck shell=bash
# 1 DGX A100 node(s) x 8 GPUs x 56 sequences x 1 accumulation = global batch 448.
# Hyperparameters: the ruleset 5.0.0 reference convergence point for this batch (RCP row BS 448).
# Evals: the trainer's default, MLPerf's cadence for this batch. WALLTIME budgets 60 min per
# run (NEXP runs in one allocation) + 5 min of setup; not yet measured on A100 hardware.
export DGXNNODES=1
# shellcheck source=config_DGXA100_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/config_DGXA100_common.sh"

export BATCHSIZE=56
export GRADIENT_STEPS=1
export LR=0.000425
export MAX_STEPS=6700
export WARMUP_STEPS=0
export START_WARMUP_STEP=0
export OPT_LAMB_BETA_1=0.9
export OPT_LAMB_BETA_2=0.999
export WEIGHT_DECAY_RATE=0.01
export MAX_SAMPLES_TERMINATION=4500000

: "${NEXP:=10}"
WALLTIME_MINUTES=60
export WALLTIME=$(( NEXP * WALLTIME_MINUTES + 5 ))
