#!/usr/bin/env bash
# Vendor the portal's browser libraries from the npm registry into elastrain/portal/static/vendor/.
# Pinned versions and integrity hashes: the portal works offline and never loads from a CDN.
# Usage: scripts/vendor_portal_assets.sh   (needs `npm`; the result is committed, so only maintainers run it)
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$HERE/elastrain/portal/static/vendor"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# name@version  integrity (sha512 of the registry tarball, from `npm view NAME@VERSION dist.integrity`)
PACKAGES=(
  "uplot@1.6.32 sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="
  "@xterm/xterm@6.0.0 sha512-TQwDdQGtwwDt+2cgKDLn0IRaSxYu1tSUjgKarSDkUM0ZNiSRXFpjxEsvc/Zgc5kq5omJ+V0a8/kIM2WD3sMOYg=="
  "@xterm/addon-fit@0.11.0 sha512-jYcgT6xtVYhnhgxh3QgYDnnNMYTcf8ElbxxFzX0IZo+vabQqSPAjC3c1wJrKB5E19VwQei89QCiZZP86DCPF7g=="
)

fetch() {  # fetch NAME@VERSION INTEGRITY -> directory with the unpacked package
  local spec="$1" want="$2" dir="$WORK/$(echo "$1" | tr '/@' '__')"
  mkdir -p "$dir"
  local tgz
  tgz="$(cd "$dir" && npm pack --silent "$spec")"
  local got="sha512-$(openssl dgst -sha512 -binary "$dir/$tgz" | base64 -w0)"
  if [ "$got" != "$want" ]; then
    echo "integrity mismatch for $spec: got $got, want $want" >&2
    exit 1
  fi
  tar xzf "$dir/$tgz" -C "$dir"
  echo "$dir/package"
}

mkdir -p "$DEST"
for entry in "${PACKAGES[@]}"; do
  read -r spec integrity <<<"$entry"
  pkg="$(fetch "$spec" "$integrity")"
  case "$spec" in
    uplot@*)
      cp "$pkg/dist/uPlot.iife.min.js" "$pkg/dist/uPlot.min.css" "$DEST/"
      cp "$pkg/LICENSE" "$DEST/uPlot.LICENSE" ;;
    @xterm/xterm@*)
      cp "$pkg/lib/xterm.js" "$DEST/xterm.js"
      cp "$pkg/css/xterm.css" "$DEST/xterm.css"
      cp "$pkg/LICENSE" "$DEST/xterm.LICENSE" ;;
    @xterm/addon-fit@*)
      cp "$pkg/lib/addon-fit.js" "$DEST/addon-fit.js" ;;
  esac
  # drop the trailing source-map reference (the maps are not vendored)
  sed -i '/^\/\/# sourceMappingURL=/d' "$DEST"/*.js
done
{
  echo "# Vendored by scripts/vendor_portal_assets.sh; do not edit by hand."
  for entry in "${PACKAGES[@]}"; do echo "$entry"; done
} >"$DEST/VERSIONS"
echo "vendored into $DEST:"
ls -l "$DEST"
