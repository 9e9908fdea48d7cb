"""The first-requests benchmark's arithmetic: cold over warm per pair and over all pairs."""

import pytest

from benchmarks.first_requests import compare, content_lines, pooled


def server(ttfts, tpots):
    return {"requests": {f"r{i}": {"ttft_ms": a, "tpot_ms": b} for i, (a, b) in enumerate(zip(ttfts, tpots))}}


def test_compare_ratios_of_means_and_per_probe():
    ratios = compare(server([200, 400], [10, 20]), server([100, 400], [10, 10]))
    assert ratios["ttft_ms"]["mean_ratio"] == pytest.approx(600 / 500)
    assert ratios["ttft_ms"]["max_ratio"] == pytest.approx(2.0)
    assert ratios["tpot_ms"]["median_ratio"] == pytest.approx(1.5)


def test_compare_skips_probes_without_a_value_on_either_side():
    ratios = compare(server([200, None], [10, 10]), server([100, 300], [10, 10]))
    assert ratios["ttft_ms"]["mean_ratio"] == pytest.approx(2.0)


def test_pooled_weighs_pairs_by_their_means_not_their_ratios():
    pairs = [{"ratios": compare(server([300], [10]), server([100], [10]))},   # 3.0, small times
             {"ratios": compare(server([900], [10]), server([1100], [10]))}]  # 0.82, large times
    overall = pooled(pairs)
    assert overall["ttft_ms"]["mean_ratio"] == pytest.approx(1200 / 1200)
    assert overall["ttft_ms"]["pair_min"] == pytest.approx(900 / 1100)
    assert overall["ttft_ms"]["pair_max"] == pytest.approx(3.0)


def test_content_lines_ignore_the_family_instruction_and_short_lines():
    prompt = "Summarise the following text in one paragraph of plain words.\nshort\n" + "x" * 40
    assert content_lines(prompt) == {"x" * 40}
