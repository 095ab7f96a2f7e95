"""The in-sandbox agent (``orchard env agent``): exec, streaming, processes, files and patches."""
