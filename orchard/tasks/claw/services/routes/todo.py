"""Todo: list, create, complete and delete items."""

from fastapi import APIRouter
from pydantic import field_validator

from ..records import TodoItem, check_date
from ..routing import AuditedRoute, RequestBody, WorldDep
from ..world import find

router = APIRouter(prefix="/todo", route_class=AuditedRoute)


class NewItem(RequestBody):
    title: str
    due: str | None = None
    notes: str = ""

    _check_due = field_validator("due")(check_date)


@router.get("/items")
async def list_items(world: WorldDep, done: bool | None = None) -> dict:
    found = [item for item in world.todos.values() if done is None or item.done == done]
    return {"items": [item.dump() for item in found]}


@router.post("/items")
async def create_item(payload: NewItem, world: WorldDep) -> dict:
    item = TodoItem(id=world.new_id("todo", world.todos), **payload.model_dump())
    world.todos[item.id] = item
    return item.dump()


@router.post("/items/{id}/complete")
async def complete_item(id: str, world: WorldDep) -> dict:
    item = find(world.todos, id, "todo item")
    item.done = True
    return item.dump()


@router.delete("/items/{id}")
async def delete_item(id: str, world: WorldDep) -> dict:
    find(world.todos, id, "todo item")
    del world.todos[id]
    return {"id": id, "status": "deleted"}
