#!/bin/bash
# Prove that the fast lane needs nothing outside its venv: run `make test-fast` in a bare container
# that has only Debian bookworm (minbase), python3 (3.11), python3-venv and make.
#
#   scripts/fast_lane_bare.sh      # exit code: the fast lane's; 77 when podman or mmdebstrap is missing
#
# The rootfs is made as `elastrain image build` makes its own (mmdebstrap from the host's apt mirror,
# elastrain.images.rootfs, then `podman import`) and kept as the podman image localhost/elastrain-bare:<key>
# (built once; the key covers the package list and this recipe). Each run copies the repository's files
# (git-tracked plus untracked, not ignored ones, as they are in the work tree: no .venv, no caches) into a
# fresh directory, then runs two containers on it (podman --runtime runc, --ulimit at this shell's hard
# limits, as the image builder does):
#   1. `make install` with the network (PyPI as the host reaches it, the host's CA bundle), the host's
#      pip sources (find-links, file:// indexes, constraint files of `pip config list` and $PIP_*)
#      mounted read-only, and a pip cache kept between runs in $CACHE/pip (a wheel built from an sdist
#      or a download is not made again); no byte-compiling (PIP_NO_COMPILE: the tests compile what
#      they import);
#   2. `make test-fast` with `--network none` (loopback only): the lint, types, import layers, unit and
#      contract tests see no host binary, daemon or network.
# Cache: $ELASTRAIN_BARE_DIR, else /var/cache/elastrain/fast-lane-bare as root, else
# ${XDG_CACHE_HOME:-~/.cache}/elastrain/fast-lane-bare. PY: a Python that imports elastrain (default
# .venv/bin/python) for the rootfs step.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "fast_lane_bare: $*" >&2; }
PY=${PY:-.venv/bin/python}
for tool in podman mmdebstrap git; do
    command -v "$tool" >/dev/null || { say "skipped: $tool is not installed (make container-deps)"; exit 77; }
done
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { say "skipped: not a git checkout"; exit 77; }
podman --runtime runc info >/dev/null 2>&1 || { say "skipped: podman cannot run containers here"; exit 77; }
[ -x "$PY" ] || { say "no $PY: run make install first (or set PY)"; exit 2; }
if [ -n "${ELASTRAIN_BARE_DIR:-}" ]; then CACHE=$ELASTRAIN_BARE_DIR
elif [ "$(id -u)" = 0 ]; then CACHE=/var/cache/elastrain/fast-lane-bare
else CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/elastrain/fast-lane-bare; fi
mkdir -p "$CACHE/pip" "$CACHE/logs"

# --- the bare image (cached) ---
PACKAGES=python3,python3-venv,make
RECIPE="1 bookworm minbase $PACKAGES"
KEY=$(printf '%s' "$RECIPE" | sha256sum | cut -c1-12)
IMAGE=localhost/elastrain-bare:$KEY
PODMAN=(podman --runtime runc)
# the image builder's --ulimit flags: nofile and nproc at this process's hard limits, nproc <= pid_max
mapfile -t ULIMITS < <("$PY" -c 'from elastrain.backends.podmanctl import ulimit_args; print(*ulimit_args(), sep="\n")')
start=$SECONDS
if "${PODMAN[@]}" image exists "$IMAGE"; then
    say "image $IMAGE cached"
else
    say "building $IMAGE: mmdebstrap bookworm minbase + $PACKAGES"
    tarball=$CACHE/$KEY.rootfs.tar
    # shellcheck disable=SC2016
    "$PY" - "$PACKAGES" "$tarball" "$CACHE/logs/mmdebstrap.log" "$IMAGE" <<'EOF'
import sys
from pathlib import Path

from elastrain.images import recipe, rootfs

packages, tarball, log, image = sys.argv[1].split(","), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
mirrors = rootfs.host_mirror_entries(recipe.SUITE)
argv = rootfs.mmdebstrap_argv(recipe.SUITE, recipe.VARIANT, packages, recipe.DPKG_OPTIONS, tarball, mirrors)
try:
    rootfs.make_rootfs(argv, log)
    rootfs.import_rootfs(tarball, image)
finally:
    tarball.unlink(missing_ok=True)
EOF
    say "built $IMAGE in $((SECONDS - start)) s"
fi

# --- a copy of the repository (what git would commit now, as it is in the work tree) ---
WORK=$(mktemp -d "${TMPDIR:-/tmp}/elastrain-bare-XXXXXX")
NAME=elastrain-bare-$$
cleanup() {
    local c=$SECONDS
    "${PODMAN[@]}" rm -f -i "$NAME-install" "$NAME-test" >/dev/null 2>&1 || true
    rm -rf "$WORK"; say "cleanup $((SECONDS - c)) s"
}
trap cleanup EXIT
mkdir "$WORK/src"
git ls-files -z --cached --others --exclude-standard |
    tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$WORK/src"

# --- the host's pip sources and CA bundle (PyPI reached as the host reaches it), read-only ---
PIPENV=() MOUNTS=()
mount_ro() { [ -e "$1" ] && MOUNTS+=(-v "$1:$1:ro"); return 0; }
# a file:// index's pages link to files beside it (../files/): its parent goes in, too
mount_source() { case $1 in file://*/simple|file://*/simple/) mount_ro "$(dirname "${1#file://}")" ;;
                 *) mount_ro "${1#file://}" ;; esac; }
while IFS= read -r line; do
    key=${line%%=*} value=${line#*=}
    key=${key#*.} value=${value#\'} value=${value%\'}
    case $key in
        find-links|extra-index-url|index-url|constraint|cert|default-timeout|no-index) ;;
        *) continue ;;
    esac
    for word in $value; do mount_source "$word"; done
    PIPENV+=(-e "PIP_$(echo "$key" | tr a-z- A-Z_)=$value")
done < <("$PY" -m pip config list 2>/dev/null | grep -v '^:env:' || true)
for var in PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_INDEX_URL PIP_CONSTRAINT PIP_CERT PIP_DEFAULT_TIMEOUT; do
    [ -n "${!var:-}" ] || continue
    for word in ${!var}; do mount_source "$word"; done
    PIPENV+=(-e "$var=${!var}")
done

RUN=("${PODMAN[@]}" run --rm "${ULIMITS[@]}" -v "$WORK/src:/src" -w /src -e HOME=/root -e LANG=C.UTF-8)
t0=$SECONDS
say "1/2 make install (network; pip cache $CACHE/pip)"
if ! "${RUN[@]}" --name "$NAME-install" "${MOUNTS[@]}" "${PIPENV[@]}" -v "$CACHE/pip:/root/.cache/pip" \
        -e PIP_DISABLE_PIP_VERSION_CHECK=1 -e PIP_PROGRESS_BAR=off -e PIP_NO_COMPILE=1 "$IMAGE" make install >"$CACHE/logs/install.log" 2>&1; then
    tail -20 "$CACHE/logs/install.log" >&2
    say "make install failed in the bare container (log: $CACHE/logs/install.log)"
    exit 1
fi
t1=$SECONDS
say "2/2 make test-fast (--network none)"
rc=0
"${RUN[@]}" --name "$NAME-test" --network none "$IMAGE" make test-fast || rc=$?
t2=$SECONDS
say "image $((t0 - start)) s, install $((t1 - t0)) s, test-fast $((t2 - t1)) s, total $((t2 - start)) s; exit $rc"
exit $rc
