"""The services config: the clock, the fault injection settings and the fixtures a task starts from."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .records import (
    CalendarEvent,
    Contact,
    Document,
    MailMessage,
    Notification,
    Record,
    TodoItem,
    check_datetime,
)

FaultKind = Literal["rate_limit", "server_error", "slow"]


class Strict(BaseModel):
    """A config section: unknown keys are errors (they are most often typos)."""

    model_config = ConfigDict(extra="forbid")


def unique_ids(records: list[Record]) -> list[Record]:
    """Refuse two records with the same id in one collection."""
    seen: set[str] = set()
    for record in records:
        if record.id in seen:
            raise ValueError(f"duplicate id {record.id!r}")
        seen.add(record.id)
    return records


class MailFixture(Strict):
    messages: list[MailMessage] = []

    _unique = field_validator("messages")(unique_ids)


class CalendarFixture(Strict):
    events: list[CalendarEvent] = []

    _unique = field_validator("events")(unique_ids)


class ContactsFixture(Strict):
    contacts: list[Contact] = []

    _unique = field_validator("contacts")(unique_ids)


class TodoFixture(Strict):
    items: list[TodoItem] = []

    _unique = field_validator("items")(unique_ids)


class NotificationsFixture(Strict):
    notifications: list[Notification] = []

    _unique = field_validator("notifications")(unique_ids)


class DocumentsFixture(Strict):
    documents: list[Document] = []

    _unique = field_validator("documents")(unique_ids)


class Fixtures(Strict):
    """The records each service starts with."""

    mail: MailFixture = MailFixture()
    calendar: CalendarFixture = CalendarFixture()
    contacts: ContactsFixture = ContactsFixture()
    todo: TodoFixture = TodoFixture()
    notifications: NotificationsFixture = NotificationsFixture()
    documents: DocumentsFixture = DocumentsFixture()


class ServicesConfig(Strict):
    """Everything one episode of the services starts from; every key is optional."""

    now: str = "2026-03-02T09:00:00"
    seed: int = 0
    fault_rate: float = Field(0.0, ge=0.0, le=1.0)
    faults: list[FaultKind] = ["rate_limit", "server_error", "slow"]
    slow_seconds: float = Field(0.5, ge=0.0)
    retry_after_seconds: int = Field(1, ge=0)
    fixtures: Fixtures = Fixtures()

    _check_now = field_validator("now")(check_datetime)


def describe_errors(error: ValidationError) -> str:
    """One line per problem, each naming its field: ``fixtures.mail.messages.0.date: <problem>``."""
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "config"
        lines.append(f"{where}: {item['msg']}")
    return "; ".join(lines)


def load_config(data: dict[str, Any]) -> ServicesConfig:
    """Validate a services config; a bad one raises ValueError naming each faulty field."""
    try:
        return ServicesConfig.model_validate(data)
    except ValidationError as error:
        raise ValueError(f"invalid services config: {describe_errors(error)}") from None
