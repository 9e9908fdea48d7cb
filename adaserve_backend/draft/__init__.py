"""The project's own draft model for the embedded default target (see model.py)."""
