"""Triton adapter: text_input (+ apply_chat_template) -> input_ids, validated as the scheduler model
validates a text prompt (adaserve_backend.triton.protocol.prompt_ids)."""

import adaserve_stub_path  # noqa: F401  first: puts PYTHONPATH on sys.path (adaserve_backend/triton/stub_path.py)
import numpy as np
import triton_python_backend_utils as pb_utils

from adaserve_backend.triton.protocol import TEXT_INPUTS, prompt_ids
from adaserve_backend.triton.repository import load_repository_tokenizer


class TritonPythonModel:
    def initialize(self, args):
        self.tokenizer = load_repository_tokenizer(args["model_repository"])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                tensors = {name: t.as_numpy() for name in TEXT_INPUTS
                           if (t := pb_utils.get_input_tensor_by_name(request, name)) is not None}
                tensor = pb_utils.Tensor("input_ids", np.asarray(prompt_ids(tensors, self.tokenizer), dtype=np.int32))
                responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
            except ValueError as e:
                error = pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
        return responses
