#!/bin/bash
# Stop the private cluster started by start_cluster.sh DIR: cancel its jobs, end its daemons by the
# PIDs recorded in DIR (slurmd, slurmctld, munged), and any process left from its jobs (slurmstepd
# and job processes carry SLURM_CONF=DIR/slurm.conf in their environment); SIGKILL after 5 s.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
D=$(cd "$1" && pwd) || exit 0
export SLURM_CONF=$D/slurm.conf
[ -f "$D/run/slurmctld.pid" ] && timeout 5 scancel --quiet --full --user=root >/dev/null 2>&1
pids=()
for f in "$D"/run/slurmd-*.pid "$D/run/slurmctld.pid" "$D/munge/munged.pid"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null) || continue
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && { kill -TERM "$pid" 2>/dev/null; pids+=("$pid"); }
done
for f in $(grep -lzx "SLURM_CONF=$D/slurm.conf" /proc/[0-9]*/environ 2>/dev/null); do
    pid=${f#/proc/}; pid=${pid%/environ}
    [ "$pid" = $$ ] || [ "$pid" = "$PPID" ] || { kill -TERM "$pid" 2>/dev/null && pids+=("$pid"); }
done
for _ in $(seq 100); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && exit 0
    sleep 0.05
done
for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
exit 0
