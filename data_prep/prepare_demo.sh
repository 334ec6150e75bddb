#!/usr/bin/env bash
# The demo's data (`make demo`): FOLDOC, the Free On-line Dictionary of Computing (Debian's
# dict-foldoc, GFDL), through the same chain as Wikipedia (prepare_data.sh) with 128-token
# samples, 20 masks and dupe factor 5: about 112k training samples and a 2,000-sample eval set.
# MAX_SEQ_LENGTH, MAX_PREDICTIONS_PER_SEQ and DUPE_FACTOR may be set instead (`make gpu-check`
# takes MLPerf's 512 and 76 where it has no Wikipedia extract).
# FOLDOC may name the dictionary's foldoc.dict.dz (`make gpu-check` takes its bundle's copy);
# else the package's is used where installed, or fetched into OUT_DIR/deb (fetch_foldoc.sh).
set -euo pipefail

: "${OUT_DIR:?set OUT_DIR, the output folder}"
: "${PYTHON:=python3}"
: "${MAX_SEQ_LENGTH:=128}"
: "${MAX_PREDICTIONS_PER_SEQ:=20}"
: "${DUPE_FACTOR:=5}"

if [[ -z "${FOLDOC:-}" ]]; then
  FOLDOC="$(bash "$(dirname "${BASH_SOURCE[0]}")/fetch_foldoc.sh" "${OUT_DIR}/deb")"
fi

"${PYTHON}" -m bertperf prep dictd --dict "${FOLDOC}" --output "${OUT_DIR}/text_source" --file_mb 0.5
export OUT_DIR PYTHON
WIKI_DIR="${OUT_DIR}/text_source" NUM_EVAL_ARTICLES=500 BLOCK_SIZE=1.0 NUM_PARTS=10 NUM_EVAL_SAMPLES=2000 \
  MAX_SEQ_LENGTH="${MAX_SEQ_LENGTH}" MAX_PREDICTIONS_PER_SEQ="${MAX_PREDICTIONS_PER_SEQ}" \
  DUPE_FACTOR="${DUPE_FACTOR}" bash "$(dirname "${BASH_SOURCE[0]}")/prepare_data.sh"
