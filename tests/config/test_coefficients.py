"""Shipped blackbox coefficients equal the BLIS golden-dataset flags."""

from __future__ import annotations

import pytest

from blisjax.config import lookup_blackbox_coefficients, shipped_blackbox_coefficients

# Copied from tests/data/blis-golden/golden_caseN.json `flags` (alpha-coeffs / beta-coeffs).
GOLDEN = [
    (
        "meta-llama/llama-3.1-8b-instruct",
        "H100",
        1,
        (232.46191091038054, 1.752360364195244, 3357.4400353290152),
        (5752.705191348184, 17.25086436834028, 5.999143920128404),
    ),
    (
        "qwen/qwen2.5-7b-instruct",
        "H100",
        4,
        (6748.565706303843, 1.60068623289796, 1952.6809484593186),
        (2206.931356893263, 16.799213648645086, 218.0953180138298),
    ),
    (
        "ibm-granite/granite-3.1-8b-instruct",
        "H100",
        2,
        (10024.457261493666, 2.110235670377125, 5822.543580863752),
        (2395.9072629127068, 11.768985404449758, 8.894510818868516),
    ),
    (
        "codellama/codellama-34b-instruct-hf",
        "H100",
        1,
        (13450.510995636703, 0.041813767451373045, 0.0),
        (26595.2781995357, 96.28441960829817, 56.58626882402723),
    ),
]


@pytest.mark.parametrize("model, gpu, tp, alpha, beta", GOLDEN)
def test_lookup_matches_golden_flags(model, gpu, tp, alpha, beta):
    assert lookup_blackbox_coefficients(model, gpu, tp) == (alpha, beta)


def test_lookup_is_case_insensitive_and_accepts_bare_names():
    expected = (GOLDEN[0][3], GOLDEN[0][4])
    assert lookup_blackbox_coefficients("Meta-Llama/Llama-3.1-8B-Instruct", "h100", 1) == expected
    assert lookup_blackbox_coefficients("llama-3.1-8b-instruct", "H100", 1) == expected


@pytest.mark.parametrize(
    "model, gpu, tp",
    [
        ("meta-llama/llama-3.1-8b-instruct", "H100", 2),
        ("meta-llama/llama-3.1-8b-instruct", "A100-80", 1),
        ("other/llama-3.1-8b-instruct", "H100", 1),
        ("nobody/nothing", "H100", 1),
    ],
)
def test_lookup_misses(model, gpu, tp):
    assert lookup_blackbox_coefficients(model, gpu, tp) is None


def test_every_entry_has_provenance():
    entries = shipped_blackbox_coefficients()
    assert len(entries) == 4
    for e in entries:
        assert "4e179804" in e.source
        assert len(e.alpha) == len(e.beta) == 3
