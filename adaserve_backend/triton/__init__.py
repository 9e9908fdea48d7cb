"""Glue between Triton's Python backend and the engine. Nothing here imports triton_python_backend_utils
at module level, so it is all importable and testable without a server."""
