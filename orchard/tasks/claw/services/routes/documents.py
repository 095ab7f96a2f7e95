"""Documents: list, read, overwrite and create."""

from fastapi import APIRouter

from ..records import Document
from ..routing import AuditedRoute, RequestBody, WorldDep
from ..world import find

router = APIRouter(prefix="/documents", route_class=AuditedRoute)


class NewDocument(RequestBody):
    title: str
    content: str


class DocumentContent(RequestBody):
    content: str


@router.get("")
async def list_documents(world: WorldDep) -> dict:
    """Ids and titles only; ``GET /documents/{id}`` has the content."""
    return {"documents": [{"id": doc.id, "title": doc.title} for doc in world.documents.values()]}


@router.get("/{id}")
async def read_document(id: str, world: WorldDep) -> dict:
    return find(world.documents, id, "document").dump()


@router.put("/{id}")
async def write_document(id: str, payload: DocumentContent, world: WorldDep) -> dict:
    doc = find(world.documents, id, "document")
    doc.content = payload.content
    return doc.dump()


@router.post("")
async def create_document(payload: NewDocument, world: WorldDep) -> dict:
    doc = Document(id=world.new_id("doc", world.documents), **payload.model_dump())
    world.documents[doc.id] = doc
    return doc.dump()
