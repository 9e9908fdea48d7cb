"""Triton adapter: (context ids, new ids) -> text_output delta; other outputs pass through."""

import adaserve_stub_path  # noqa: F401  first: puts PYTHONPATH on sys.path (adaserve_backend/triton/stub_path.py)
import numpy as np
import triton_python_backend_utils as pb_utils

from adaserve_backend.serving.detokenize import text_delta
from adaserve_backend.triton.protocol import PASS_THROUGH_OUTPUTS
from adaserve_backend.triton.repository import load_repository_tokenizer


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
