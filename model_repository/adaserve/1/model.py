"""Triton adapter for the decoupled scheduler model; all logic is in adaserve_backend."""

import faulthandler

import adaserve_stub_path  # noqa: F401  first: puts PYTHONPATH on sys.path (adaserve_backend/triton/stub_path.py)
import triton_python_backend_utils as pb_utils

from adaserve_backend.triton.engine_loop import TritonEngineLoop


class TritonPythonModel:
    def initialize(self, args):
        # A crash of this stub (a fatal signal in C code) prints every thread's Python stack to the server's
        # log: the stub's interpreter ignores PYTHONFAULTHANDLER, and without the stacks a crash names no call.
        faulthandler.enable(all_threads=True)
        self.loop = TritonEngineLoop(pb_utils, args["model_repository"], model_name=args["model_name"])

    def execute(self, requests):
        for request in requests:
            self.loop.submit(request)
        return None

    def finalize(self):
        self.loop.shutdown()
