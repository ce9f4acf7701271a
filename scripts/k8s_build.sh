#!/bin/bash
# Build a private Kubernetes control plane (kube-apiserver, kube-scheduler, kube-controller-manager)
# and kubelet from Debian's `kubernetes` source package (1.20, GOPATH mode, as debian/rules builds it)
# into a cache directory outside the repository; `make k8s-deps` runs it. Reused when present.
#
#   scripts/k8s_build.sh            # builds into $ELASTRAIN_K8S_DIR (default below), prints the dir
#
# Cache: $ELASTRAIN_K8S_DIR, else /var/cache/elastrain/k8s as root, else
# ${XDG_CACHE_HOME:-~/.cache}/elastrain/k8s (= elastrain.testing.k8s.cache_dir). Layout: bin/ (the
# binaries), VERSION (the Debian source version). Build tools (golang-go, rsync, jq, dpkg-dev, curl)
# and Debian's etcd-server are installed with apt-get when missing and running as root; so is what the
# test node (elastrain.testing.k8s_node: the kubelet's pods) runs on, even when the build is reused:
# containerd, runc, containernetworking-plugins, dnsmasq-base, catatonit, iproute2. The source
# comes from `apt-get source` where deb-src lines exist, else as .dsc + files from the Debian mirror
# of /etc/apt's sources (dpkg-source checks the checksums the .dsc lists). The compile runs with
# `nice -n ${K8S_NICE:-15}`; its log stays in the cache dir (build.log).
set -euo pipefail
if [ -n "${ELASTRAIN_K8S_DIR:-}" ]; then CACHE=$ELASTRAIN_K8S_DIR
elif [ "$(id -u)" = 0 ]; then CACHE=/var/cache/elastrain/k8s
else CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/elastrain/k8s; fi
BINS="kube-apiserver kube-scheduler kube-controller-manager kubelet"
have_all() { for b in $BINS; do [ -x "$CACHE/bin/$b" ] || return 1; done; }
node=()
for t in containerd:containerd runc:runc dnsmasq:dnsmasq-base catatonit:catatonit ip:iproute2; do
    command -v "${t%%:*}" >/dev/null || [ -x "/usr/sbin/${t%%:*}" ] || node+=("${t#*:}")
done
[ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ] || node+=(containernetworking-plugins)
if [ ${#node[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${node[@]}" >&2 ||
            echo "k8s_build: could not install ${node[*]}: pods will not run in make test-k8s" >&2
    else
        echo "k8s_build: missing ${node[*]} (apt-get install them as root): pods will not run" >&2
    fi
fi
if have_all; then echo "k8s_build: reusing $CACHE/bin ($(cat "$CACHE/VERSION" 2>/dev/null))" >&2; echo "$CACHE"; exit 0; fi

need=()
command -v go >/dev/null || need+=(golang-go)
command -v etcd >/dev/null || need+=(etcd-server)
command -v rsync >/dev/null || need+=(rsync)
command -v jq >/dev/null || need+=(jq)
command -v dpkg-source >/dev/null || need+=(dpkg-dev)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "k8s_build: missing ${need[*]}; install them as root (apt-get install ${need[*]})" >&2; exit 3; }
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >&2
fi

mkdir -p "$CACHE"
WORK=$CACHE/src
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
VERSION=$(apt-cache show kubernetes-client 2>/dev/null | sed -n 's/^Version: //p' | head -1)
[ -n "$VERSION" ] || { echo "k8s_build: apt knows no kubernetes-client package (Debian bookworm has 1.20); run apt-get update" >&2; exit 4; }
if ! apt-get source --download-only "kubernetes=$VERSION" >/dev/null 2>&1; then
    # no deb-src lines: fetch the .dsc and its files from the mirror the binary packages come from
    MIRROR=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
             /etc/apt/sources.list.d/*.list 2>/dev/null | grep -oE 'https?://[^ ]+/debian/?( |$)' \
             | grep -v security | head -1 | tr -d ' ' || true)
    MIRROR=${MIRROR%/}; MIRROR=${MIRROR:-http://deb.debian.org/debian}
    POOL=$MIRROR/pool/main/k/kubernetes
    DSC=kubernetes_${VERSION}.dsc
    curl -fsSLO "$POOL/$DSC" || { echo "k8s_build: cannot download $POOL/$DSC" >&2; exit 5; }
    for f in $(awk '/^Files:/{f=1;next} /^[^ ]/{f=0} f{print $3}' "$DSC"); do
        curl -fsSLO "$POOL/$f" || { echo "k8s_build: cannot download $POOL/$f" >&2; exit 5; }
    done
fi
dpkg-source -x kubernetes_*.dsc kubernetes >&2   # verifies the checksums the .dsc lists
cd kubernetes
mkdir -p .go/src/k8s.io
ln -sfn ../../.. .go/src/k8s.io/kubernetes
START=$(date +%s)
# as debian/rules: GOPATH mode, no cgo; the binaries stripped (-s -w) to keep the cache small
env GOPATH="$PWD/.go" CGO_ENABLED=0 HOME="$WORK/home" GOCACHE="$WORK/gocache" GOLDFLAGS="-s -w" \
    nice -n "${K8S_NICE:-15}" make WHAT="$(printf 'cmd/%s ' $BINS)" >"$CACHE/build.log" 2>&1 || {
    echo "k8s_build: the build failed; the end of $CACHE/build.log:" >&2; tail -30 "$CACHE/build.log" >&2; exit 6; }
mkdir -p "$CACHE/bin.new"
for b in $BINS; do install -m 0755 "_output/bin/$b" "$CACHE/bin.new/$b"; done
rm -rf "$CACHE/bin" && mv "$CACHE/bin.new" "$CACHE/bin"
echo "$VERSION" >"$CACHE/VERSION"
echo "k8s_build: built $BINS ($VERSION) in $(( $(date +%s) - START )) s into $CACHE/bin" | tee -a "$CACHE/build.log" >&2
cd "$CACHE" && rm -rf "$WORK"   # the source tree and Go's build cache (several GB) are not needed again
echo "$CACHE"
