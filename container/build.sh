#!/usr/bin/env bash
# The bertperf image on a plain Debian base, for machines with podman and no image registry
# (`make container-image`, README "Running"):
#
#   sudo CONTAINERS_CONF=container/containers.conf container/build.sh
#
# 1. BASE_IMAGE: Debian bookworm (debootstrap --variant=minbase from DEBIAN_MIRROR) with Python 3
#    in a venv at /opt/python, trusting the host's own CA certificates (/usr/local/share/
#    ca-certificates: a proxy's, where there is one; pip told to use the system's store), imported
#    with `podman import`. Made once: the image carries a label with its recipe (and a hash of
#    those certificates) and is made again only when that changes.
# 2. The CPU torch wheel (TORCH_CPU, from PYTHON's pip: its cache or index) in .whl/, the build
#    context's wheel folder, which the Dockerfile installs from when the base has no torch.
# 3. CONT: the Dockerfile built on BASE_IMAGE (podman's layer cache: unchanged inputs, no rebuild).
set -euo pipefail

: "${BASE_IMAGE:=localhost/bertperf-base:bookworm}"
: "${CONT:=localhost/bertperf:cpu}"
: "${DEBIAN_MIRROR:=http://deb.debian.org/debian}"
: "${TORCH_CPU:=torch==2.13.0}"
: "${PYTHON:=python3}"
: "${PODMAN:=podman}"

fail() { echo "container/build.sh: error: $*" >&2; exit 1; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ "$(id -u)" == 0 ]] || fail "debootstrap and podman's image store need root (run with sudo)"
command -v "${PODMAN}" >/dev/null || fail "${PODMAN}: not installed (apt-get install podman runc)"
command -v debootstrap >/dev/null || fail "debootstrap: not installed (apt-get install debootstrap)"

host_cas=(/usr/local/share/ca-certificates/*.crt)
[[ -e "${host_cas[0]}" ]] || host_cas=()
recipe="bookworm minbase ${DEBIAN_MIRROR} python3 python3-venv ca-certificates /opt/python"
recipe+=" cas:$(cat "${host_cas[@]}" /dev/null | sha256sum | cut -c1-16)"
label=$("${PODMAN}" image inspect --format '{{index .Labels "bertperf.base"}}' "${BASE_IMAGE}" \
          2>/dev/null || true)
if [[ "${label}" != "${recipe}" ]]; then
  echo "container/build.sh: making ${BASE_IMAGE} (debootstrap bookworm from ${DEBIAN_MIRROR})"
  work=$(mktemp -d /tmp/bertperf-base.XXXXXX)
  trap 'rm -rf "${work}"' EXIT
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
    "${work}/rootfs" "${DEBIAN_MIRROR}" > "${work}/debootstrap.log" \
    || fail "debootstrap failed: $(tail -n 1 "${work}/debootstrap.log")"
  cp "${host_cas[@]}" "${work}/rootfs/usr/local/share/ca-certificates/"
  chroot "${work}/rootfs" update-ca-certificates >/dev/null
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "${work}/rootfs/etc/pip.conf"
  chroot "${work}/rootfs" python3 -m venv /opt/python
  rm -rf "${work}"/rootfs/var/cache/apt/archives/*.deb "${work}"/rootfs/var/lib/apt/lists/*
  tar -C "${work}/rootfs" -cf "${work}/rootfs.tar" .
  "${PODMAN}" import --quiet \
    --change "ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "LABEL bertperf.base=\"${recipe}\"" \
    "${work}/rootfs.tar" "${BASE_IMAGE}" >/dev/null
fi

if ! compgen -G "${here}/.whl/torch-*.whl" >/dev/null; then
  "${PYTHON}" -m pip download --quiet --no-deps --only-binary=:all: -d "${here}/.whl" "${TORCH_CPU}"
fi

"${PODMAN}" build --network host --build-arg FROM_IMAGE_NAME="${BASE_IMAGE}" -t "${CONT}" \
  "${here}"
