#!/usr/bin/env bash
# The demo's data (`make demo`): FOLDOC, the Free On-line Dictionary of Computing (Debian's
# dict-foldoc, GFDL), through the same chain as Wikipedia (prepare_data.sh) with 128-token
# samples, 20 masks and dupe factor 5: about 112k training samples and a 2,000-sample eval set.
# MAX_SEQ_LENGTH, MAX_PREDICTIONS_PER_SEQ and DUPE_FACTOR may be set instead (`make gpu-check`
# takes MLPerf's 512 and 76 where it has no Wikipedia extract).
# The package is used where installed, else fetched with `apt-get download` (no root needed)
# into OUT_DIR/deb and unpacked there.
set -euo pipefail

: "${OUT_DIR:?set OUT_DIR, the output folder}"
: "${PYTHON:=python3}"
: "${FOLDOC:=/usr/share/dictd/foldoc.dict.dz}"
: "${MAX_SEQ_LENGTH:=128}"
: "${MAX_PREDICTIONS_PER_SEQ:=20}"
: "${DUPE_FACTOR:=5}"

if [[ ! -f "${FOLDOC}" ]]; then
  FOLDOC="${OUT_DIR}/deb/usr/share/dictd/foldoc.dict.dz"
  if [[ ! -f "${FOLDOC}" ]]; then
    mkdir -p "${OUT_DIR}/deb"
    ( cd "${OUT_DIR}/deb" && apt-get download dict-foldoc >/dev/null ) || {
      echo "prepare_demo.sh: error: cannot fetch dict-foldoc (apt-get download dict-foldoc failed;" \
           "run 'apt-get update' as root, or install it: apt-get install dict-foldoc)" >&2
      exit 1; }
    dpkg-deb -x "${OUT_DIR}"/deb/dict-foldoc_*.deb "${OUT_DIR}/deb"
  fi
fi

"${PYTHON}" -m bertperf prep dictd --dict "${FOLDOC}" --output "${OUT_DIR}/text_source" --file_mb 0.5
export OUT_DIR PYTHON
WIKI_DIR="${OUT_DIR}/text_source" NUM_EVAL_ARTICLES=500 BLOCK_SIZE=1.0 NUM_PARTS=10 NUM_EVAL_SAMPLES=2000 \
  MAX_SEQ_LENGTH="${MAX_SEQ_LENGTH}" MAX_PREDICTIONS_PER_SEQ="${MAX_PREDICTIONS_PER_SEQ}" \
  DUPE_FACTOR="${DUPE_FACTOR}" bash "$(dirname "${BASH_SOURCE[0]}")/prepare_data.sh"
