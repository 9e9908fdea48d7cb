"""Triton adapter for the client-facing pipeline; all logic is in adaserve_backend."""

import json

import adaserve_stub_path  # noqa: F401  first: puts PYTHONPATH on sys.path (adaserve_backend/triton/stub_path.py)
import triton_python_backend_utils as pb_utils

from adaserve_backend.triton.pipeline import BLSPipeline
from adaserve_backend.triton.repository import load_engine_config


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        detokenizer = parameters.get("detokenizer", {}).get("string_value", "scheduler")
        grace_s = load_engine_config(args["model_repository"]).drain.grace_s
        self.pipeline = BLSPipeline(pb_utils, model_name=args["model_name"], detokenizer=detokenizer,
                                    drain_grace_s=grace_s)

    def execute(self, requests):
        for request in requests:
            self.pipeline.submit(request)
        return None

    def finalize(self):
        self.pipeline.shutdown()
