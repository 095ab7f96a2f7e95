"""Mail: list, read, send, move, label, mark read and delete (move to trash) messages."""

from fastapi import APIRouter
from pydantic import Field

from ..records import MailMessage, parse_datetime
from ..routing import AuditedRoute, RequestBody, WorldDep
from ..world import World, find

router = APIRouter(prefix="/mail", route_class=AuditedRoute)

# The user's own address, as the sender of the messages they send.
USER_ADDRESS = "me"


class SendRequest(RequestBody):
    to: list[str] = Field(min_length=1)
    subject: str
    body: str
    cc: list[str] = []
    in_reply_to: str | None = None


class MoveRequest(RequestBody):
    folder: str = Field(min_length=1)


class LabelRequest(RequestBody):
    label: str = Field(min_length=1)


def message(world: World, message_id: str) -> MailMessage:
    return find(world.messages, message_id, "message")


@router.get("/messages")
async def list_messages(world: WorldDep, folder: str = "inbox", unread: bool | None = None,
                        q: str | None = None) -> dict:
    """Summaries (no body) of a folder's messages, newest first; ``q`` matches subject, body or sender."""
    needle = (q or "").lower()
    found = [
        m for m in world.messages.values()
        if m.folder == folder
        and (unread is None or m.read != unread)
        and any(needle in text.lower() for text in (m.subject, m.body, m.sender))
    ]
    found.sort(key=lambda m: parse_datetime(m.date), reverse=True)
    return {"messages": [m.summary() for m in found]}


@router.get("/messages/{id}")
async def read_message(id: str, world: WorldDep) -> dict:
    """The full message; reading it does not mark it read."""
    return message(world, id).dump()


@router.post("/send")
async def send(payload: SendRequest, world: WorldDep) -> dict:
    """Send a message; it is kept in the ``sent`` folder."""
    if payload.in_reply_to is not None:
        message(world, payload.in_reply_to)
    message_id = world.new_id("msg", world.messages)
    world.messages[message_id] = MailMessage(
        id=message_id,
        folder="sent",
        sender=USER_ADDRESS,
        to=payload.to,
        cc=payload.cc,
        subject=payload.subject,
        body=payload.body,
        date=world.now,
        read=True,
        in_reply_to=payload.in_reply_to,
    )
    return {"id": message_id, "status": "sent"}


@router.post("/messages/{id}/move")
async def move(id: str, payload: MoveRequest, world: WorldDep) -> dict:
    found = message(world, id)
    found.folder = payload.folder
    return found.summary()


@router.post("/messages/{id}/label")
async def label(id: str, payload: LabelRequest, world: WorldDep) -> dict:
    found = message(world, id)
    if payload.label not in found.labels:
        found.labels.append(payload.label)
    return found.summary()


@router.post("/messages/{id}/read")
async def mark_read(id: str, world: WorldDep) -> dict:
    found = message(world, id)
    found.read = True
    return found.summary()


@router.delete("/messages/{id}")
async def delete(id: str, world: WorldDep) -> dict:
    """Deleting moves the message to the ``trash`` folder."""
    found = message(world, id)
    found.folder = "trash"
    return found.summary()
