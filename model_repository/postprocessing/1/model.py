"""Triton adapter: (context ids, new ids) -> text_output delta; other outputs pass through."""

import os
import sys

# The backend stub's embedded interpreter ignores PYTHONPATH; honour it so the project and its virtual
# environment (set up by adaserve_backend.triton.server) are importable.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from adaserve_backend.triton.detokenize import text_delta  # noqa: E402
from adaserve_backend.triton.protocol import PASS_THROUGH_OUTPUTS  # noqa: E402
from adaserve_backend.triton.repository import load_repository_tokenizer  # noqa: E402



class TritonPythonModel:
    def initialize(self, args):
        self.tokenizer = load_repository_tokenizer(args["model_repository"])

    def execute(self, requests):
        responses = []
        for request in requests:
            new = pb_utils.get_input_tensor_by_name(request, "output_ids").as_numpy().reshape(-1).tolist()
            context = pb_utils.get_input_tensor_by_name(request, "context_ids").as_numpy().reshape(-1).tolist()
            text = text_delta(self.tokenizer, context, new)
            outputs = [pb_utils.Tensor("text_output", np.asarray([text.encode("utf-8")], dtype=object))]
            for name in PASS_THROUGH_OUTPUTS:
                t = pb_utils.get_input_tensor_by_name(request, name)
                if t is not None:
                    outputs.append(pb_utils.Tensor(name, t.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
