#!/bin/bash
# A private 4-node Slurm cluster (n1..n4, 4 fake GPUs each) on this one machine, from Debian's
# slurm-wlm 22.05 and munge, as root. Everything (config, munge key and socket, spool, logs, PIDs)
# lives under DIR; nothing system-wide is touched apart from installing the packages if missing.
#
#   scripts/slurm/start_cluster.sh DIR [PORT_BASE]    # then: export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm/stop_cluster.sh DIR
#
# PORT_BASE (default $ELASTRAIN_SLURM_PORT or 26817): slurmctld listens on PORT_BASE, the slurmd of
# node nK on PORT_BASE+3+K (the 6817 / 6821..6824 layout of a default cluster, shifted).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [PORT_BASE]" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "start_cluster.sh: must run as root (slurmd and munged need it)" >&2; exit 3; }
D=$(mkdir -p "$1" && cd "$1" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
BASE=${2:-${ELASTRAIN_SLURM_PORT:-26817}}
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >&2
fi
chmod 755 "$D"   # munged runs as the munge user and must reach its socket directory
mkdir -p "$D/spool/ctld" "$D/log" "$D/run" "$D/dev" "$D/munge"
fill() {
    sed -e "s#@DIR@#$D#g" -e "s#@PORT_CTLD@#$BASE#g" \
        -e "s#@PORT_N1@#$((BASE + 4))#g" -e "s#@PORT_N2@#$((BASE + 5))#g" \
        -e "s#@PORT_N3@#$((BASE + 6))#g" -e "s#@PORT_N4@#$((BASE + 7))#g" "$1" > "$2"
}
fill "$HERE/slurm.conf.in" "$D/slurm.conf"
fill "$HERE/gres.conf.in" "$D/gres.conf"
export SLURM_CONF=$D/slurm.conf
for n in 1 2 3 4; do for g in 0 1 2 3; do
    [ -e "$D/dev/fakegpu_n${n}_$g" ] || mknod "$D/dev/fakegpu_n${n}_$g" c 1 3   # like /dev/null
done; done
# A private munged (own key, socket, PID file) so that stopping this cluster stops nothing else.
M=$D/munge
[ -s "$M/munge.key" ] || dd if=/dev/urandom of="$M/munge.key" bs=1 count=1024 2>/dev/null
chown -R munge:munge "$M"; chmod 711 "$M"; chmod 400 "$M/munge.key"   # 711: clients reach the socket
runuser -u munge -- /usr/sbin/munged --socket="$M/munge.socket" --key-file="$M/munge.key" \
    --pid-file="$M/munged.pid" --log-file="$M/munged.log" --seed-file="$M/munged.seed"
slurmctld -i
for n in n1 n2 n3 n4; do slurmd -N "$n"; done
for _ in $(seq 240); do
    [ "$(sinfo -h -N -o %T 2>/dev/null | grep -cx idle)" = 4 ] && exit 0
    sleep 0.05
done
echo "start_cluster.sh: the cluster did not come up; see $D/log" >&2
exit 1
