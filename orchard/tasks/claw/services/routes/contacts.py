"""Contacts: search and read the address book (read-only)."""

from fastapi import APIRouter

from ..routing import AuditedRoute, WorldDep
from ..world import find

router = APIRouter(prefix="/contacts", route_class=AuditedRoute)


@router.get("")
async def search_contacts(world: WorldDep, q: str | None = None) -> dict:
    """Contacts whose name, email or team contains ``q`` (any case); all of them without ``q``."""
    needle = (q or "").lower()
    found = [
        contact for contact in world.contacts.values()
        if any(needle in text.lower() for text in (contact.name, contact.email, contact.team))
    ]
    return {"contacts": [contact.dump() for contact in found]}


@router.get("/{id}")
async def get_contact(id: str, world: WorldDep) -> dict:
    return find(world.contacts, id, "contact").dump()
