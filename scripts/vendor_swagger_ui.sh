#!/usr/bin/env bash
# Vendor Swagger UI (the API docs page at /docs) from the npm registry into elastrain/server/static/swagger/.
# Pinned version and integrity hash: /docs works offline and never loads from a CDN.
# Usage: scripts/vendor_swagger_ui.sh   (needs `npm`; the result is committed, so only maintainers run it)
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$HERE/elastrain/server/static/swagger"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# name@version  integrity (sha512 of the registry tarball, from `npm view NAME@VERSION dist.integrity`)
SPEC="swagger-ui-dist@5.35.0"
INTEGRITY="sha512-U06rpMtW9V3XPGOBeamTUSr0Z09jMX4IJuANpE/EZbAhw0G8CgwrzU4YmXkn/h0wCDNsXdGarTNNHC3sU8yVUQ=="

tgz="$(cd "$WORK" && npm pack --silent "$SPEC")"
got="sha512-$(openssl dgst -sha512 -binary "$WORK/$tgz" | base64 -w0)"
if [ "$got" != "$INTEGRITY" ]; then
  echo "integrity mismatch for $SPEC: got $got, want $INTEGRITY" >&2
  exit 1
fi
tar xzf "$WORK/$tgz" -C "$WORK"
mkdir -p "$DEST"
for f in swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt swagger-ui.css favicon-32x32.png LICENSE NOTICE; do
  cp "$WORK/package/$f" "$DEST/$f"
done
# drop the trailing source-map references (the maps are not vendored)
sed -i '/^\/\/# sourceMappingURL=/d' "$DEST/swagger-ui-bundle.js"
sed -i '/^\/\*# sourceMappingURL=.*\*\/$/d' "$DEST/swagger-ui.css"
{
  echo "# Vendored by scripts/vendor_swagger_ui.sh; do not edit by hand."
  echo "$SPEC $INTEGRITY"
} >"$DEST/VERSIONS"
echo "vendored into $DEST:"
ls -l "$DEST"
