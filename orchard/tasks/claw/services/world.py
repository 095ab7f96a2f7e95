"""The mutable state of the services during one episode: every record, the clock and the final answer."""

from dataclasses import dataclass, field
from typing import TypeVar

from .config import ServicesConfig
from .errors import NotFound
from .records import CalendarEvent, Contact, Document, MailMessage, Notification, Record, TodoItem

R = TypeVar("R", bound=Record)


def by_id(records: list[R]) -> dict[str, R]:
    """Index records by id, keeping their order."""
    return {record.id: record for record in records}


def find(records: dict[str, R], record_id: str, noun: str) -> R:
    """The record with that id, or a 404 naming the kind of record (``noun``)."""
    try:
        return records[record_id]
    except KeyError:
        raise NotFound(noun, record_id) from None


@dataclass
class World:
    """All records, by id, in the order they were created (fixtures first)."""

    now: str
    messages: dict[str, MailMessage]
    events: dict[str, CalendarEvent]
    contacts: dict[str, Contact]
    todos: dict[str, TodoItem]
    notifications: dict[str, Notification]
    documents: dict[str, Document]
    answer: str | None = None
    last_new_id: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: ServicesConfig) -> "World":
        """A fresh world holding copies of the config's fixtures."""
        fixtures = config.fixtures.model_copy(deep=True)
        return cls(
            now=config.now,
            messages=by_id(fixtures.mail.messages),
            events=by_id(fixtures.calendar.events),
            contacts=by_id(fixtures.contacts.contacts),
            todos=by_id(fixtures.todo.items),
            notifications=by_id(fixtures.notifications.notifications),
            documents=by_id(fixtures.documents.documents),
        )

    def new_id(self, prefix: str, records: dict[str, R]) -> str:
        """The next deterministic id ``<prefix>-new-<n>`` not already used in ``records``."""
        n = self.last_new_id.get(prefix, 0)
        while True:
            n += 1
            candidate = f"{prefix}-new-{n}"
            if candidate not in records:
                self.last_new_id[prefix] = n
                return candidate

    def snapshot(self) -> dict:
        """The whole state as JSON, in the shapes of the fixtures, plus ``answer`` and ``now``."""

        def dump(records: dict[str, R]) -> list[dict]:
            return [record.dump() for record in records.values()]

        return {
            "mail": {"messages": dump(self.messages)},
            "calendar": {"events": dump(self.events)},
            "contacts": {"contacts": dump(self.contacts)},
            "todo": {"items": dump(self.todos)},
            "notifications": {"notifications": dump(self.notifications)},
            "documents": {"documents": dump(self.documents)},
            "answer": self.answer,
            "now": self.now,
        }
