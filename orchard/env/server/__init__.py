"""The orchestrator (``orchard env serve``): lifecycle, auth, and the forwarded hot path."""
