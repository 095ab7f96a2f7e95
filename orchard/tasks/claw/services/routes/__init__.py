"""The policy-facing routers, one module per service."""

from . import answer, calendar, contacts, documents, mail, notifications, todo

ROUTERS = [
    mail.router,
    calendar.router,
    contacts.router,
    todo.router,
    notifications.router,
    documents.router,
    answer.router,
]
