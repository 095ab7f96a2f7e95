"""Calendar: list events overlapping a window, create, update and delete events."""

from datetime import datetime

from fastapi import APIRouter
from pydantic import field_validator

from ..errors import BadRequest
from ..records import CalendarEvent, check_datetime, parse_datetime
from ..routing import AuditedRoute, RequestBody, WorldDep
from ..world import find

router = APIRouter(prefix="/calendar", route_class=AuditedRoute)


class NewEvent(RequestBody):
    title: str
    start: str
    end: str
    attendees: list[str] = []
    location: str = ""

    _check_times = field_validator("start", "end")(check_datetime)


class EventChanges(RequestBody):
    """The fields to change; those left out (or null) keep their value."""

    title: str | None = None
    start: str | None = None
    end: str | None = None
    attendees: list[str] | None = None
    location: str | None = None

    @field_validator("start", "end")
    @classmethod
    def _check_times(cls, value: str | None) -> str | None:
        return None if value is None else check_datetime(value)


def query_time(name: str, value: str | None) -> datetime | None:
    """A query parameter's date-time, or None when absent; a malformed one is a 400 naming it."""
    if value is None:
        return None
    try:
        return parse_datetime(value)
    except ValueError:
        raise BadRequest(name, f"not an ISO 8601 date-time: {value!r}") from None


def check_order(start: str, end: str) -> None:
    """Refuse an event that ends before it starts (or as it starts)."""
    if parse_datetime(end) <= parse_datetime(start):
        raise BadRequest("end", "must be after start")


@router.get("/events")
async def list_events(world: WorldDep, start: str | None = None, end: str | None = None) -> dict:
    """Events that overlap [start, end) (either bound may be left out), by start time."""
    window_start, window_end = query_time("start", start), query_time("end", end)
    found = [
        event for event in world.events.values()
        if (window_end is None or parse_datetime(event.start) < window_end)
        and (window_start is None or parse_datetime(event.end) > window_start)
    ]
    found.sort(key=lambda event: parse_datetime(event.start))
    return {"events": [event.dump() for event in found]}


@router.post("/events")
async def create_event(payload: NewEvent, world: WorldDep) -> dict:
    check_order(payload.start, payload.end)
    event = CalendarEvent(id=world.new_id("evt", world.events), **payload.model_dump())
    world.events[event.id] = event
    return event.dump()


@router.patch("/events/{id}")
async def update_event(id: str, payload: EventChanges, world: WorldDep) -> dict:
    event = find(world.events, id, "event").model_copy(update=payload.model_dump(exclude_none=True))
    check_order(event.start, event.end)
    world.events[id] = event
    return event.dump()


@router.delete("/events/{id}")
async def delete_event(id: str, world: WorldDep) -> dict:
    find(world.events, id, "event")
    del world.events[id]
    return {"id": id, "status": "deleted"}
