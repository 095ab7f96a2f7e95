"""opkit: named one-line helpers."""
