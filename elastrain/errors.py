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
    │   └── PeerFailure             a collective elastrain issued failed (a peer died); the loop rejoins
    ├── JobFailed             the training function raised an ordinary exception (reported to the
    │                         coordinator); uncaught, the worker exits with `ExitCode.FAILED`
    └── CheckpointError       a checkpoint directory or file that cannot be used

How a worker process ends is decided by its entry point (the Python interpreter running the user's
script, with the policy `elastrain.runtime.entry` installs), never by a call to ``sys.exit`` deep in
the library. The library raises one of these instead; they derive from :class:`SystemExit` (as
``sys.exit`` does), so a user's ``except Exception`` does not swallow them and the interpreter exits
with their ``code``, the exit code the agent and the coordinator read:

    SystemExit
    └── WorkerExit            the worker stops here; ``code`` is an `ExitCode`
        ├── WorkerLeft        told to leave (scale-in) or the job is over: exit 0
        └── CoordinatorGone   the coordinator never came back (rank 0 wrote a checkpoint): exit 3
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit codes of a worker process, as the agent and the coordinator read them."""

    DONE = 0  # finished, or left the job when told to
    FAILED = 1  # the training function raised; the job fails
    COORDINATOR_GONE = 3  # the coordinator did not come back; `elastrain run --resume auto` restarts


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
    """A collective elastrain issued failed (a peer died or the group was torn down).

    Chained from the backend's error (``raise PeerFailure(...) from exc``). Errors raised by the
    user's own code are never turned into this: they fail the job (`JobFailed`).
    """


class JobFailed(ElastrainError):
    """The training function raised an ordinary exception; the whole job stops with a non-zero exit.

    Raised by `elastrain.run` (chained from the user's exception) once the error has been reported
    to the coordinator (`reported` is then True). Uncaught, the worker's entry-point policy ends the
    process with `ExitCode.FAILED` without printing the traceback a second time.
    """

    def __init__(self, message: str, reported: bool = False) -> None:
        super().__init__(message)
        self.reported = reported


class CheckpointError(ElastrainError):
    """A checkpoint directory or file that cannot be used (missing, foreign, torn, newer format)."""


class WorkerExit(SystemExit):
    """The worker process stops here with exit code `code` (an `ExitCode`); not an error."""

    exit_code: ExitCode = ExitCode.DONE

    def __init__(self, reason: str = "") -> None:
        super().__init__(int(self.exit_code))
        self.reason = reason

    def __str__(self) -> str:
        return self.reason or type(self).__name__


class WorkerLeft(WorkerExit):
    """The coordinator told this worker to leave (scale-in), or the job is over: exit code 0."""

    exit_code = ExitCode.DONE


class CoordinatorGone(WorkerExit):
    """The coordinator never came back within its timeout: exit code 3 (the launcher resumes later)."""

    exit_code = ExitCode.COORDINATOR_GONE
