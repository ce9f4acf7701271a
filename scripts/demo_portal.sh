#!/usr/bin/env bash
# Start `elastrain server` with a sample cluster and a running elastic training job, for looking at
# the web portal: open the printed URL, sign in with the printed token, scale the cluster and watch
# the job's world-size chart follow. Ctrl-C deletes the cluster and stops the server (by PID).
# Usage: scripts/demo_portal.sh   (env: PORT=8080 DATA=<temp dir> GPUS=8)
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
PY="$HERE/.venv/bin/python"
PORT="${PORT:-8080}"
GPUS="${GPUS:-8}"
DATA="${DATA:-$(mktemp -d /tmp/elastrain-portal-demo.XXXXXX)}"
URL="http://127.0.0.1:$PORT"
mkdir -p "$DATA/examples"
cp "$HERE/examples/mnist_elastic.py" "$HERE/examples/mnist1d_data.py" "$DATA/examples/"

# the process backend refuses jobs and terminals unless told that this one machine's user is trusted
"$PY" -m elastrain server --backend process --insecure-host-commands --port "$PORT" \
  --data-dir "$DATA/server" --gpus "$GPUS" --allow-mount "$DATA" >"$DATA/server.log" 2>&1 &
SERVER=$!
cleanup() {
  trap - EXIT INT TERM
  echo "stopping: deleting the demo cluster, then the server (pid $SERVER)"
  ELASTRAIN_URL="$URL" ELASTRAIN_TOKEN="${TOKEN:-}" "$PY" -m elastrain cluster delete demo >/dev/null 2>&1 || true
  kill "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
}
trap cleanup EXIT INT TERM

for _ in $(seq 1 100); do
  [ -s "$DATA/server/admin-token" ] && "$PY" -c "import httpx,sys; httpx.get('$URL/api/v1/healthz').raise_for_status()" 2>/dev/null && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$DATA/server.log"; exit 1; }
  sleep 0.3
done
TOKEN="$(cat "$DATA/server/admin-token")"
export ELASTRAIN_URL="$URL" ELASTRAIN_TOKEN="$TOKEN"
"$PY" -m elastrain cluster create demo --framework horovod --containers 2 --gpus-per-container 1 \
  --shm 1Gi --mount "$DATA/examples:/examples" --wait
"$PY" -m elastrain job submit demo -- elastrain run -v --min-np 2 --max-np 4 --hostfile /etc/mpi/hostfile \
  --join-grace 1 python /examples/mnist_elastic.py --epochs 1000 --batch-size 256 --step-sleep 0.05

cat <<MSG

  elastrain portal: $URL   (sign in with the API token below)
  token:            $TOKEN
  cluster page:     $URL/clusters/demo   (scale it to 4 and watch the job's world size grow 2 -> 4)
  data, logs:       $DATA
  Ctrl-C to stop.
MSG
wait "$SERVER"
