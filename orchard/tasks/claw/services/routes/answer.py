"""The agent's final answer (the harness's ``finish`` tool), kept for graders; never faulted."""

from fastapi import APIRouter

from ..routing import RequestBody, UnfaultedRoute, WorldDep

router = APIRouter(route_class=UnfaultedRoute)


class Answer(RequestBody):
    answer: str


@router.post("/answer")
async def record_answer(payload: Answer, world: WorldDep) -> dict:
    """Record the final answer; a later one replaces it."""
    world.answer = payload.answer
    return {"status": "recorded"}
