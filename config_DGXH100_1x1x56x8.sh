# shellcheck shell=bash
# One H100 (80 GB) with gradient accumulation to the RCP batch of one DGX A100: 1 GPU x 56
# sequences x 8 micro-batches = global batch 448; hyperparameters from the ruleset 5.0.0 RCP
# row BS 448. WALLTIME budgets 120 min per run (an estimate: not yet measured end to end).
export DGXNNODES=1
export DGXNGPU=1
export SUBMISSION_PLATFORM="1xNVIDIA H100 80GB"

: "${DATADIR_PHASE2:=/raid/datasets/bert/unpadded}"
: "${EVAL_FILE:=/raid/datasets/bert/eval/eval_10k.hdf5}"
: "${INIT_CHECKPOINT:=/raid/datasets/bert/phase1/model.ckpt-28252}"
export DATADIR_PHASE2 EVAL_FILE INIT_CHECKPOINT
export BERT_CONFIG=large
export PRECISION=bf16
export EVAL_BATCHSIZE=128
export TARGET_MLM_ACCURACY=0.720
export LOG_FREQ=50

export BATCHSIZE=56
export GRADIENT_STEPS=8
export LR=0.000425
export MAX_STEPS=6700
export WARMUP_STEPS=0
export START_WARMUP_STEP=0
export OPT_LAMB_BETA_1=0.9
export OPT_LAMB_BETA_2=0.999
export WEIGHT_DECAY_RATE=0.01
export EVAL_ITER_START_SAMPLES=150000
export EVAL_ITER_SAMPLES=150000
export MAX_SAMPLES_TERMINATION=4500000

: "${NEXP:=10}"
WALLTIME_MINUTES=120
export WALLTIME=$(( NEXP * WALLTIME_MINUTES + 5 ))
