"""Runnable contextpipe examples (``contextpipe serve examples.weather:agent`` from the repository root)."""
