"""OpenAI-compatible HTTP API in front of Triton's `adaserve` model or Ray Serve (see http_app.py)."""
