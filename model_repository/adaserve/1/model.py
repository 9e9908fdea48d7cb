"""Triton adapter for the decoupled scheduler model; all logic is in adaserve_backend."""

import os
import sys

# The backend stub's embedded interpreter ignores PYTHONPATH; honour it so the project and its virtual
# environment (set up by adaserve_backend.triton.server) are importable.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import triton_python_backend_utils as pb_utils  # noqa: E402

from adaserve_backend.triton.engine_loop import TritonEngineLoop  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        self.loop = TritonEngineLoop(pb_utils, args["model_repository"])

    def execute(self, requests):
        for request in requests:
            self.loop.submit(request)
        return None

    def finalize(self):
        self.loop.shutdown()
