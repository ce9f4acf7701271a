"""The elastrain exception tree.

Every error elastrain raises on purpose derives from :class:`ElastrainError` and carries a message that
says what is wrong and how to fix it, so the CLI can print it as one line without a traceback.

    ElastrainError
    ├── ConfigError           bad flags, bad arguments, a script that does not exist
    │   └── HostfileError     a malformed hostfile (names the file, the line and the fix)
    ├── RendezvousError       the coordinator refused or lost us; not enough workers in time
    │   └── CoordinatorLost   the coordinator stopped answering
    ├── MembershipChange      control flow inside the elastic loop (not a failure)
    │   ├── HostsUpdatedInterrupt   a new generation is pending: stop at this commit
    │   └── PeerFailure             a collective failed because a peer died
    ├── JobFailed             a worker raised an ordinary exception; the job ends
    └── CheckpointError       a checkpoint directory or file that cannot be used
"""

from __future__ import annotations


class ElastrainError(Exception):
    """Root of every error elastrain raises on purpose."""


class ConfigError(ElastrainError):
    """Invalid user input: flags, arguments, paths."""


class HostfileError(ConfigError):
    """A hostfile that cannot be parsed; the message names the file and the line."""


class RendezvousError(ElastrainError):
    """The rendezvous could not admit this worker (refused, timed out, job over)."""


class CoordinatorLost(RendezvousError):
    """The connection to the coordinator broke and could not be re-established."""


class MembershipChange(ElastrainError):
    """Raised inside the elastic loop to unwind to the rendezvous; never escapes `elastrain.run`."""


class HostsUpdatedInterrupt(MembershipChange):
    """A new generation is pending; every rank stops at the same committed step."""


class PeerFailure(MembershipChange):
    """A collective failed (a peer died or the group was torn down)."""


class JobFailed(ElastrainError):
    """A worker raised an ordinary exception; the whole job stops with a non-zero exit."""


class CheckpointError(ElastrainError):
    """A checkpoint directory or file that cannot be used (missing, foreign, torn, newer format)."""
