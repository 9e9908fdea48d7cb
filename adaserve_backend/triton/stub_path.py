"""Imported first by every model.py in model_repository/, as `adaserve_stub_path`: the launcher
(server.backend_directory) copies this file beside triton_python_backend_utils.py, the one directory on
the backend stub's sys.path that all models share.

Why it exists: the Python backend stub embeds an *isolated* interpreter (sys.flags.isolated and
ignore_environment are 1 inside the stub), so the PYTHONPATH the launcher sets (this project and
its virtual environment's site-packages) is never read. Its sys.path holds only the system Python's
directories, the model's own directories and the backend directory. This honours PYTHONPATH.
No imports beyond the standard library: nothing else is importable yet.
"""

import os
import sys

sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
