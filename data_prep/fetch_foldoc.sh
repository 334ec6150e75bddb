#!/usr/bin/env bash
# FOLDOC, the Free On-line Dictionary of Computing (Debian's dict-foldoc, GFDL): prints the path
# of foldoc.dict.dz (foldoc.index beside it), the installed one where there is one, else fetched
# with `apt-get download` (no root needed) into DIR and unpacked there (kept: a rerun reuses it).
set -euo pipefail

dir="${1:?usage: fetch_foldoc.sh DIR}"
installed=/usr/share/dictd/foldoc.dict.dz
fetched="${dir}/usr/share/dictd/foldoc.dict.dz"

if [[ -f "${installed}" ]]; then echo "${installed}"; exit 0; fi
if [[ ! -f "${fetched}" ]]; then
  mkdir -p "${dir}"
  ( cd "${dir}" && apt-get download dict-foldoc >/dev/null ) || {
    echo "fetch_foldoc.sh: error: cannot fetch dict-foldoc (apt-get download dict-foldoc failed;" \
         "run 'apt-get update' as root, or install it: apt-get install dict-foldoc)" >&2
    exit 1; }
  dpkg-deb -x "${dir}"/dict-foldoc_*.deb "${dir}"
fi
echo "${fetched}"
