"""The two exceptions Horovod's elastic mode is built on, as elastrain raises them."""

from __future__ import annotations

from elastrain.errors import HostsUpdatedInterrupt as _ElastrainHostsUpdated


class HorovodInternalError(RuntimeError):
    """A collective operation failed (a peer died, or the group went away during a resize).

    Inside ``hvd.elastic.run`` it is recoverable: the state is restored to its last commit, the
    worker rejoins the job and training resumes in the next generation.
    """


class HostsUpdatedInterrupt(_ElastrainHostsUpdated, RuntimeError):
    """The set of workers is about to change; raised by ``state.commit()``/``check_host_updates()``.

    Every rank raises it at the same commit. ``hvd.elastic.run`` then rejoins without restoring the
    state (it was just committed). It is also an ``elastrain.HostsUpdatedInterrupt``.
    """

    def __init__(self, skip_sync: bool = False, message: str = "the set of hosts changed") -> None:
        super().__init__(message)
        self.skip_sync = skip_sync


__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]
