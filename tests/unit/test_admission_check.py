"""benchmarks/admission_check.py: the admit-off run paired with the served one, refusals scored."""

from benchmarks.admission_check import ADMIT_OFF, describe, with_admit_off, wrongly_refused
from harness.metrics import RequestRecord


def test_admit_off_runs_right_after_adaserve_as_a_best_effort_variant():
    systems, variants = with_admit_off(["vllm", "adaserve", "llamacpp-bf16"], {})
    assert systems == ["vllm", "adaserve", ADMIT_OFF, "llamacpp-bf16"]
    assert variants["admit-off"] == {"scheduler": {"overload": "best_effort"}}
    assert with_admit_off(["vllm"], {})[0] == ["adaserve", ADMIT_OFF, "vllm"]
    systems, variants = with_admit_off(["adaserve:m0"], {"m0": {"scheduler": {"first_token_margin_ms": 0}}})
    assert systems == ["adaserve:m0", "adaserve:m0+admit-off"]
    assert variants["m0+admit-off"] == {"scheduler": {"first_token_margin_ms": 0, "overload": "best_effort"}}


def test_a_refusal_is_wrong_when_the_same_request_admitted_met_both_targets():
    rows = [{"system": "adaserve", "rps": 3, "window": 0, "requests": 10, "rejected": 3,
             "refused_ids": ["a", "b", "c"], "attained_ids": ["d"]},
            {"system": ADMIT_OFF, "rps": 3, "window": 0, "requests": 10, "refused_ids": [],
             "attained_ids": ["a", "c", "d"]},
            {"system": "vllm", "rps": 3, "window": 0, "requests": 10, "refused_ids": [], "attained_ids": []}]
    out = wrongly_refused(rows)
    assert out[0]["wrongly_refused"] == 2 and out[0]["wrongly_refused_share"] == 0.2
    assert "wrongly_refused" not in out[1] and "wrongly_refused" not in out[2]
    assert describe(out) == ["adaserve @ 3 rps, window 0: refused 3 of 10, 2 of them met both targets with "
                             "admission off (20.0% of those sent)"]


def test_a_refusal_is_told_from_a_failure():
    def rec(error):
        return RequestRecord("r", "chat", 80.0, 0.0, error=error)

    assert rec("InferenceServerException: StatusCode.UNAVAILABLE: refused").refused
    assert rec("APIStatusError: Error code: 503 - overloaded").refused
    assert not rec("not finished within the time limit").refused and not rec(None).refused
