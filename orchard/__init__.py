"""Orchard: an open-source agentic modeling framework."""

__version__ = "0.1.0"
