"""Orchard-Claw: personal-assistant tasks over small mail, calendar, contacts, todo, notification and document services."""
