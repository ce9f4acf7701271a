"""horovodrun's options (Horovod 0.28.1's ``horovod/runner/launch.py``) and what elastrain does with each.

``run``: translated into ``elastrain run`` flags or the workers' environment; ``noop``: accepted and
ignored (they tune Horovod's C++ core or its ssh launch, neither of which exists here); ``refuse``:
refused by name with the reason (MPI). The last three are elastrain's own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    """One horovodrun option: its spellings, how many values it takes, and what elastrain does with it."""

    names: tuple[str, ...]
    nargs: int
    kind: str  # run: translated; noop: accepted, ignored; refuse: refused with `help` as the reason
    help: str
    dest: str = ""
    type: type = str


def _noop(*names: str, nargs: int = 1, what: str = "Horovod tuning") -> Flag:
    return Flag(names, nargs, "noop", f"accepted, ignored ({what})")


_MPI = "elastrain has no MPI: the Horovod API runs over torch.distributed (gloo/NCCL); drop it"
FLAGS: tuple[Flag, ...] = (
    Flag(
        ("-np", "--num-proc"),
        1,
        "run",
        "training processes (elastic: to start with; default --min-np, or all slots)",
        "np",
        int,
    ),
    Flag(("-H", "--hosts"), 1, "run", "hosts and slots: host1:2,host2:4 (default localhost:<np>)", "hosts"),
    Flag(
        ("-hostfile", "--hostfile"),
        1,
        "run",
        "hostfile of 'host slots=N' lines; watched: edits resize the job",
        "hostfile",
    ),
    Flag(
        ("--host-discovery-script",),
        1,
        "run",
        "prints 'host[:slots]' lines; polled: changes resize the job",
        "host_discovery_script",
    ),
    Flag(
        ("--min-np", "--min-num-proc"),
        1,
        "run",
        "fewest processes to keep training (default -np)",
        "min_np",
        int,
    ),
    Flag(
        ("--max-np", "--max-num-proc"),
        1,
        "run",
        "most processes to grow to (default: what the hosts offer)",
        "max_np",
        int,
    ),
    Flag(
        ("--slots-per-host", "--slots"),
        1,
        "run",
        "slots of a host given without ':slots' (-H, discovery)",
        "slots",
        int,
    ),
    Flag(
        ("--start-timeout",),
        1,
        "run",
        "seconds for the first processes to start (env HOROVOD_START_TIMEOUT)",
        "start_timeout",
        float,
    ),
    Flag(
        ("--elastic-timeout",),
        1,
        "run",
        "seconds allowed below --min-np (env HOROVOD_ELASTIC_TIMEOUT)",
        "elastic_timeout",
        float,
    ),
    Flag(
        ("--network-interface", "--network-interfaces"),
        1,
        "run",
        "interface(s) for the collectives: sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME",
        "nics",
    ),
    Flag(("--gloo-timeout-seconds",), 1, "run", "timeout of a collective, seconds", "gloo_timeout", float),
    Flag(("--gloo",), 0, "run", "use gloo (always: it is the only controller)", "gloo"),
    Flag(("--verbose",), 0, "run", "log elastrain's coordinator decisions", "verbose"),
    Flag(
        ("--log-level",),
        1,
        "run",
        "HOROVOD_LOG_LEVEL for the workers; DEBUG or TRACE also logs the coordinator's decisions",
        "log_level",
    ),
    Flag(
        ("-v", "--version"), 0, "run", "print the version of the Horovod API implemented and exit", "version"
    ),
    Flag(("-cb", "--check-build"), 0, "run", "print what is available and exit", "check_build"),
    Flag(
        ("--reset-limit",), 1, "noop", "accepted, not enforced (elastrain does not cap the number of resizes)"
    ),
    Flag(
        ("--output-filename",),
        1,
        "noop",
        "accepted, not supported: the workers' output stays on this terminal",
    ),
    Flag(
        ("-p", "--ssh-port"),
        1,
        "noop",
        "accepted, unused: elastrain starts workers through its agents, not ssh",
    ),
    Flag(
        ("-i", "--ssh-identity-file"),
        1,
        "noop",
        "accepted, unused: elastrain starts workers through its agents, not ssh",
    ),
    _noop("--disable-cache", nargs=0, what="there are no launch checks to cache"),
    _noop("--tcp", nargs=0, what="collectives always use TCP"),
    _noop("--blacklist-cooldown-range", nargs=2, what="elastrain retires failed hosts itself"),
    _noop("--fusion-threshold-mb"),
    _noop("--cycle-time-ms"),
    _noop("--cache-capacity"),
    _noop("--hierarchical-allreduce", "--no-hierarchical-allreduce", nargs=0),
    _noop("--hierarchical-allgather", "--no-hierarchical-allgather", nargs=0),
    _noop("--torus-allreduce", "--no-torus-allreduce", nargs=0),
    _noop("--autotune", "--no-autotune", nargs=0),
    _noop("--autotune-log-file"),
    _noop("--autotune-warmup-samples"),
    _noop("--autotune-steps-per-sample"),
    _noop("--autotune-bayes-opt-max-samples"),
    _noop("--autotune-gaussian-process-noise"),
    _noop("--timeline-filename", what="there is no Horovod timeline"),
    _noop(
        "--timeline-mark-cycles", "--no-timeline-mark-cycles", nargs=0, what="there is no Horovod timeline"
    ),
    _noop("--no-stall-check", "--stall-check", nargs=0),
    _noop("--stall-check-warning-time-seconds"),
    _noop("--stall-check-shutdown-time-seconds"),
    _noop("--mpi-threads-disable", "--no-mpi-threads-disable", nargs=0),
    _noop("--num-nccl-streams"),
    _noop("--thread-affinity"),
    _noop(
        "--log-with-timestamp",
        "--log-without-timestamp",
        "-prefix-timestamp",
        "--prefix-output-with-timestamp",
        "--log-hide-timestamp",
        "--no-log-hide-timestamp",
        nargs=0,
        what="output formatting",
    ),
    Flag(("--mpi",), 0, "refuse", _MPI),
    Flag(("--jsrun",), 0, "refuse", "elastrain has no jsrun/MPI launch; drop it"),
    Flag(("--mpi-args",), 1, "refuse", _MPI),
    Flag(("--binding-args",), 1, "refuse", _MPI),
    Flag(("--config-file",), 1, "refuse", "not supported; give the flags on the command line"),
    Flag(
        ("--ledger",),
        1,
        "run",
        "elastrain: write the exactly-once ledger and generation events here",
        "ledger",
    ),
    Flag(
        ("--join-grace",),
        1,
        "run",
        "elastrain: seconds to wait for more new workers before resizing",
        "join_grace",
        float,
    ),
    Flag(
        ("--mode",),
        1,
        "run",
        "elastrain: native (default: the script uses the Horovod API) or restart (a plain "
        "torch.distributed script, restarted at each resize; the Horovod API would see a world of one)",
        "mode",
    ),
)
BY_NAME = {name: flag for flag in FLAGS for name in flag.names}


__all__ = ["BY_NAME", "FLAGS", "Flag"]
