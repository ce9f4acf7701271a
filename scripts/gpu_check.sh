#!/usr/bin/env bash
# The GPU suite (tests/gpu) on a machine with NVIDIA GPUs; exits with pytest's exit code.
# - one GPU: the one-GPU part on the host (an elastic `elastrain run` whose tensors live on the GPU:
#   resize, kill -9, state broadcast, checkpoint of CUDA tensors); no podman needed. The venv's torch
#   must be a CUDA build: `make install` gets it from PyPI on a machine without the CPU wheel on disk.
# - two or more GPUs: also the NCCL part across containers (needs podman; builds the image, as root:
#   container-deps installs podman, runc and mmdebstrap with apt).
# ELASTRAIN_REQUIRE_GPU=1 makes "no CUDA device" an error instead of a skip: a skipped run here must not
# read as a pass. Usage: scripts/gpu_check.sh   (from anywhere; it works in the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

echo "== GPUs (nvidia-smi -L)"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
nvidia-smi -L || echo "nvidia-smi failed or is missing: the server's inventory will find no real GPUs"
echo "== CDI specs (the NVIDIA container toolkit: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml)"
found=0
for dir in /etc/cdi /var/run/cdi; do
  if [ -d "$dir" ]; then ls -l "$dir"; found=1; fi
done
[ "$found" = 1 ] || echo "none under /etc/cdi or /var/run/cdi"

make install
.venv/bin/python -c 'import torch; print("== host torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count() if torch.cuda.is_available() else 0)'
if [ "$gpus" -ge 2 ]; then
  make container-deps
  .venv/bin/elastrain image build
else
  echo "== $gpus GPU(s): the NCCL container part (>= 2 GPUs) will skip; the one-GPU part runs on the host"
fi

status=0
ELASTRAIN_REQUIRE_GPU=1 .venv/bin/python -m pytest -q -rs -m gpu tests/gpu -p no:cacheprovider || status=$?
exit "$status"
