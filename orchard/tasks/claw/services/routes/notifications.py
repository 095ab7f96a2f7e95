"""Notifications: list, mark read and dismiss."""

from fastapi import APIRouter

from ..records import parse_datetime
from ..routing import AuditedRoute, WorldDep
from ..world import find

router = APIRouter(prefix="/notifications", route_class=AuditedRoute)


@router.get("")
async def list_notifications(world: WorldDep, unread: bool | None = None,
                             include_dismissed: bool = False) -> dict:
    """Notifications, newest first; dismissed ones only with ``include_dismissed``."""
    found = [
        note for note in world.notifications.values()
        if (include_dismissed or not note.dismissed) and (unread is None or note.read != unread)
    ]
    found.sort(key=lambda note: parse_datetime(note.date), reverse=True)
    return {"notifications": [note.dump() for note in found]}


@router.post("/{id}/read")
async def mark_read(id: str, world: WorldDep) -> dict:
    note = find(world.notifications, id, "notification")
    note.read = True
    return note.dump()


@router.post("/{id}/dismiss")
async def dismiss(id: str, world: WorldDep) -> dict:
    note = find(world.notifications, id, "notification")
    note.dismissed = True
    return note.dump()
