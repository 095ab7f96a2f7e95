"""Software-engineering tasks."""
