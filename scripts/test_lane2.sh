#!/usr/bin/env bash
# The second lane of `make test`. Most of its time is spent waiting (containers starting, heartbeats
# timing out, Slurm scheduling, a browser rendering), so LANE2_SHARDS pytest processes (default 2) run
# at once, each a balanced share of whole test modules (tests/sharding.py): first its share of
# REST_TESTS, then its share of the FAST_TESTS marked LANE2_RUN. The tests marked `serial` (they measure
# latencies) run last, alone, then the leave-nothing check. Each share's output is printed when it ends;
# any failure fails the lane.
#
# The framework images are built first, one after the other (with podman; a no-op when cached): a
# share's test would otherwise wait, inside its own timeout, for the other share's build.
#
# Environment (set by the Makefile): PYTEST (the pytest command), ELASTRAIN (the CLI), REST_TESTS,
# FAST_TESTS, LANE2_RUN;
# optional LANE2_SHARDS, and LANE2_DURATIONS_DIR to record every share's test durations there
# (merge them into tests/durations.json to rebalance: scripts/merge_durations.py).
set -u
shards=${LANE2_SHARDS:-2}
read -r -a pytest <<<"$PYTEST"
read -r -a rest <<<"$REST_TESTS"
read -r -a fast <<<"$FAST_TESTS"
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# the leave-nothing check: what exists now is not the lane's; what is new and still there at the end
# (elastrain-* containers, networks and temp dirs, processes of the run) fails the lane
"${pytest[0]}" -m elastrain.testing.leftovers mark "$logs/before.json"

record() {  # record <name>: the --record-durations option for this run, when asked for
    [ -n "${LANE2_DURATIONS_DIR:-}" ] && echo "--record-durations=$LANE2_DURATIONS_DIR/$1.json"
}

share() {  # share <k>: run the k-th share of both selections; non-zero when either failed
    local k=$1 status=0
    "${pytest[@]}" -p tests.sharding --shard "$k/$shards" $(record "rest-$k") --durations=15 "${rest[@]}" || status=1
    "${pytest[@]}" -p tests.sharding --shard "$k/$shards" $(record "marked-$k") --durations=5 \
        -m "$LANE2_RUN" "${fast[@]}" || [ $? = 5 ] || status=1
    return $status
}

if command -v podman >/dev/null && command -v mmdebstrap >/dev/null; then
    frameworks=$("${pytest[0]}" -c 'from elastrain.images.recipe import RECIPES; print(*RECIPES)')
    for framework in $frameworks; do
        echo "== image: $framework"
        "$ELASTRAIN" image build --framework "$framework" --timeout 1800 >"$logs/image.log" 2>&1 ||
            { tail -20 "$logs/image.log"; echo "image $framework: the build failed; its tests say so"; }
    done
fi

pids=()
for k in $(seq 1 "$shards"); do
    share "$k" >"$logs/share-$k.log" 2>&1 &
    pids+=($!)
done
echo "== second lane: ${rest[*]}, and ${fast[*]} -m '$LANE2_RUN': $shards shares at once (pids ${pids[*]})"
status=0
for k in $(seq 1 "$shards"); do
    wait "${pids[$((k - 1))]}" || status=1
    echo "== share $k/$shards"
    cat "$logs/share-$k.log"
done
echo "== serial (alone): -m serial ${rest[*]} ${fast[*]}"
"${pytest[@]}" -p tests.sharding $(record serial) -m serial "${rest[@]}" "${fast[@]}" || [ $? = 5 ] || status=1
echo "== leave-nothing check"
"${pytest[0]}" -m elastrain.testing.leftovers check "$logs/before.json" || status=1
exit $status
