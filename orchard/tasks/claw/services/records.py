"""The records the services hold: mail messages, events, contacts, todo items, notifications, documents.

The same shapes serve as fixtures (in the services config), as API responses and as the state that
graders read from ``GET /_admin/state``. Ids are strings; optional fields get defaults. Unknown fields are
refused, so a typo in a fixture is an error rather than a silently missing value.
"""

from datetime import UTC, date, datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator


def parse_datetime(value: str) -> datetime:
    """Parse an ISO 8601 date-time; an aware one becomes naive UTC so that all of them compare."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed


def check_datetime(value: str) -> str:
    """Return ``value`` unchanged if it is an ISO 8601 date-time, else raise ValueError."""
    try:
        parse_datetime(value)
    except ValueError:
        raise ValueError(f"not an ISO 8601 date-time: {value!r}") from None
    return value


def check_date(value: str | None) -> str | None:
    """Return ``value`` unchanged if it is None or an ISO 8601 date (or date-time), else raise ValueError."""
    if value is None:
        return None
    try:
        date.fromisoformat(value)
    except ValueError:
        try:
            parse_datetime(value)
        except ValueError:
            raise ValueError(f"not an ISO 8601 date: {value!r}") from None
    return value


class Record(BaseModel):
    """A record with a string id; unknown fields are refused, and aliases (``from``) are accepted."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: str

    def dump(self) -> dict:
        """The record as JSON, with the field names of the fixtures (``from``, not ``sender``)."""
        return self.model_dump(by_alias=True)


class MailMessage(Record):
    folder: str = "inbox"
    sender: str = Field("", alias="from")
    to: list[str] = []
    cc: list[str] = []
    subject: str = ""
    body: str = ""
    date: str
    read: bool = False
    labels: list[str] = []
    in_reply_to: str | None = None

    _check_date = field_validator("date")(check_datetime)

    def summary(self) -> dict:
        """The message without its body, as listings show it."""
        return self.model_dump(by_alias=True, exclude={"body"})


class CalendarEvent(Record):
    title: str
    start: str
    end: str
    attendees: list[str] = []
    location: str = ""

    _check_times = field_validator("start", "end")(check_datetime)


class Contact(Record):
    name: str
    email: str = ""
    phone: str = ""
    team: str = ""
    notes: str = ""


class TodoItem(Record):
    title: str
    due: str | None = None
    notes: str = ""
    done: bool = False

    _check_due = field_validator("due")(check_date)


class Notification(Record):
    source: str = ""
    title: str = ""
    body: str = ""
    date: str
    kind: str = "system"
    read: bool = False
    dismissed: bool = False

    _check_date = field_validator("date")(check_datetime)


class Document(Record):
    title: str
    content: str = ""
