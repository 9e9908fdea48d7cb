"""OpenAI-compatible HTTP API in front of the Triton ensemble (see server.py)."""
