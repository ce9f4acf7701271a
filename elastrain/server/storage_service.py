"""The storage-area operations of the API (``/api/v1/storage``): each user sees and changes only their own
areas (another user's name is a 404, as an unknown one); an area some cluster of its owner mounts cannot
be deleted (409)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from elastrain.db.models import Cluster, EventAction, User
from elastrain.db.repository import add_event
from elastrain.db.session import Database
from elastrain.server.errors import Conflict
from elastrain.server.fields import Body, StorageName
from elastrain.server.mount_sources import mounted_areas
from elastrain.server.storage import StorageAreas


class StorageCreate(Body):
    """A new storage area of the caller."""

    model_config = ConfigDict(extra="forbid")

    name: StorageName = Field(description="a DNS label, unique among the caller's areas", examples=["mnist"])


class StorageOut(BaseModel):
    """One of the caller's storage areas."""

    name: str
    mount: str = Field(
        description="how a cluster mounts it (give any absolute target)", examples=["storage:mnist:/data"]
    )
    mounted_by: list[str] = Field(description="the caller's clusters that mount it now")


@dataclass
class StorageService:
    """Create, list and delete the caller's storage areas (`StorageAreas` on disk, owner-scoped)."""

    db: Database
    areas: StorageAreas
    owner_uid: Callable[[int], int | None]  # user id -> the uid their areas belong to (None: the server's)

    def _mounted_by(self, user: User) -> dict[str, list[str]]:
        with self.db.session() as session:
            clusters = session.scalars(
                select(Cluster).where(Cluster.owner_id == user.id).order_by(Cluster.id)
            )
            found: dict[str, list[str]] = {}
            for cluster in clusters:
                for name in mounted_areas(cluster.mounts):
                    found.setdefault(name, []).append(cluster.name)
            return found

    def _out(self, name: str, mounted_by: dict[str, list[str]]) -> StorageOut:
        return StorageOut(name=name, mount=f"storage:{name}:/data", mounted_by=mounted_by.get(name, []))

    def list_areas(self, user: User) -> list[StorageOut]:
        """The caller's areas, by name."""
        mounted = self._mounted_by(user)
        return [self._out(area.name, mounted) for area in self.areas.areas(user.id)]

    def get(self, user: User, name: str) -> StorageOut:
        """One of the caller's areas (404 for another user's, as for an unknown name)."""
        return self._out(self.areas.get(user.id, name).name, self._mounted_by(user))

    def create(self, user: User, name: str) -> StorageOut:
        """A new empty area owned by the caller's uid in containers (409: exists; 403: past the count)."""
        area = self.areas.create(user.id, name, self.owner_uid(user.id))
        with self.db.session() as session:
            add_event(session, user.name, EventAction.storage_created, owner_id=user.id, storage=name)
        return self._out(area.name, {})

    def delete(self, user: User, name: str) -> None:
        """Remove the area and its files; 409 while a cluster of the caller mounts it."""
        self.areas.get(user.id, name)  # 404 first
        users = self._mounted_by(user).get(name, [])
        if users:
            raise Conflict(
                f"storage area {name!r} is mounted by cluster(s) {', '.join(users)}; delete them first"
            )
        self.areas.delete(user.id, name)
        with self.db.session() as session:
            add_event(session, user.name, EventAction.storage_deleted, owner_id=user.id, storage=name)
