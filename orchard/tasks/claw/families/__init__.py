"""The Claw task families: personal-assistant workflows over the tool services (:mod:`.base` says what a
family provides), from one call (:mod:`.quick_action`, the curriculum's first rung) to whole workflows.
:data:`FAMILIES` maps each family's name to its module."""

from __future__ import annotations

from orchard.tasks.claw.families import (
    document_edit,
    inbox_triage,
    meeting_scheduling,
    notification_cleanup,
    quick_action,
    todo_from_mail,
)
from orchard.tasks.claw.families.base import Family

FAMILIES: dict[str, Family] = {
    family.NAME: family
    for family in (quick_action, inbox_triage, meeting_scheduling, notification_cleanup, todo_from_mail, document_edit)
}

__all__ = ["FAMILIES", "Family"]
