"""Triton adapter: text_input -> input_ids."""

import adaserve_stub_path  # noqa: F401  first: puts PYTHONPATH on sys.path (adaserve_backend/triton/stub_path.py)
import numpy as np
import triton_python_backend_utils as pb_utils

from adaserve_backend.triton.repository import encode_prompt, load_repository_tokenizer


class TritonPythonModel:
    def initialize(self, args):
        self.tokenizer = load_repository_tokenizer(args["model_repository"])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
                if text.size != 1:
                    raise ValueError(f"text_input must hold exactly one string, got {text.size}")
                chat = pb_utils.get_input_tensor_by_name(request, "apply_chat_template")
                raw = text[0] if isinstance(text[0], bytes) else str(text[0]).encode()
                ids = encode_prompt(self.tokenizer, raw, bool(chat is not None and chat.as_numpy().reshape(-1)[0]))
                tensor = pb_utils.Tensor("input_ids", np.asarray(ids, dtype=np.int32))
                responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
            except ValueError as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG)))
        return responses
