#!/usr/bin/env bash
# The GPU suite (tests/gpu), on a machine with >= 2 NVIDIA GPUs, the NVIDIA driver and podman:
# installs, builds the image, runs `pytest -m gpu tests/gpu`; exits with pytest's exit code.
# ELASTRAIN_REQUIRE_GPU=1 makes "no GPUs / no podman" an error instead of a skip: a skipped run here
# must not read as a pass. Run as root (container-deps installs podman, runc and mmdebstrap with apt).
# Usage: scripts/gpu_check.sh   (from anywhere; it works in the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

echo "== GPUs (nvidia-smi -L)"
nvidia-smi -L || echo "nvidia-smi failed or is missing: the server's inventory will find no real GPUs"
echo "== CDI specs (the NVIDIA container toolkit: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml)"
found=0
for dir in /etc/cdi /var/run/cdi; do
  if [ -d "$dir" ]; then ls -l "$dir"; found=1; fi
done
[ "$found" = 1 ] || echo "none under /etc/cdi or /var/run/cdi"

make install container-deps
.venv/bin/elastrain image build

status=0
ELASTRAIN_REQUIRE_GPU=1 .venv/bin/python -m pytest -q -rs -m gpu tests/gpu -p no:cacheprovider || status=$?
exit "$status"
