"""The safe metric-expression evaluator: arithmetic, lookups, errors, constraints."""

from __future__ import annotations

import math

import pytest

from search.expr import (
    ExpressionError,
    compile_constraint,
    compile_expression,
    flatten_metrics,
)

METRICS = {
    "instance_id": "cluster",
    "completed_requests": 10,
    "responses_per_sec": 4.0,
    "ttft_mean_ms": 250.0,
    "e2e_p99_ms": 1200.0,
    "slo_attainment": {"overall": 0.95, "good": 19, "per_class": {"critical": {"attainment": 0.9}}},
    "per_tenant": {"alice-x": {"ttft_p99_ms": 300.0}, "bob": {"ttft_p99_ms": 100.0}},
}


def test_flatten_metrics_dotted_keys_and_group_alias():
    flat = flatten_metrics(METRICS)
    assert "instance_id" not in flat  # strings are not metrics
    assert flat["per_tenant.alice-x.ttft_p99_ms"] == 300.0
    assert flat["slo_attainment.per_class.critical.attainment"] == 0.9
    assert flat["slo_attainment"] == 0.95  # group with "overall" is usable by its own name
    assert flat["completed_requests"] == 10.0


@pytest.mark.parametrize("text, value", [
    ("-e2e_p99_ms", -1200.0),
    ("responses_per_sec - 0.01 * ttft_mean_ms", 1.5),
    ("(responses_per_sec + 1) ** 2 / 5", 5.0),
    ("completed_requests % 4", 2.0),
    ("max(ttft_mean_ms, 300, 10)", 300.0),
    ("min(ttft_mean_ms, e2e_p99_ms)", 250.0),
    ("abs(-3) + sqrt(16) + log10(100) + log(exp(1))", 10.0),
    ("slo_attainment", 0.95),
    ("slo_attainment.good", 19.0),
    ('per_tenant["alice-x"].ttft_p99_ms - per_tenant.bob.ttft_p99_ms', 200.0),
    ("+2", 2.0),
])
def test_expressions_evaluate_to_hand_values(text, value):
    assert compile_expression(text).evaluate(METRICS) == pytest.approx(value)


def test_division_by_zero_is_ieee_not_an_exception():
    assert compile_expression("1 / (completed_requests - 10)").evaluate(METRICS) == math.inf
    assert math.isnan(compile_expression("0 / (completed_requests - 10)").evaluate(METRICS))


def test_names_are_collected_in_order():
    e = compile_expression("a + b.c - a * d[\"e-f\"]")
    assert e.names == ("a", "b.c", "d.e-f")


def test_unknown_metric_names_it_and_lists_available():
    e = compile_expression("throughput_rps - 0.01 * ttft_mean_ms", "--objective")
    with pytest.raises(ExpressionError) as info:
        e.evaluate(METRICS, "--objective")
    msg = str(info.value)
    assert "--objective: unknown metric 'throughput_rps'" in msg
    assert "responses_per_sec" in msg and "ttft_mean_ms" in msg and "per_tenant" in msg
    with pytest.raises(ExpressionError, match="unknown metric 'throughput_rps'"):
        e.check_names(flatten_metrics(METRICS), "--objective")


def test_check_names_accepts_nested_paths_of_known_groups():
    flat = flatten_metrics(METRICS)
    compile_expression("per_tenant.carol.ttft_p99_ms").check_names(flat)
    with pytest.raises(ExpressionError, match="unknown metric 'per_tenant.carol.ttft_p99_ms'"):
        compile_expression("per_tenant.carol.ttft_p99_ms").evaluate(METRICS)


@pytest.mark.parametrize("text, match", [
    ("__import__('os').system('true')", "only the functions"),
    ("ttft_mean_ms.__class__", None),  # a lookup of a key that does not exist, never getattr
    ("lambda: 1", "Lambda is not allowed"),
    ("[1, 2]", "List is not allowed"),
    ("'abc'", "only numeric constants"),
    ("True", "only numeric constants"),
    ("ttft_mean_ms if 1 else 2", "IfExp is not allowed"),
    ("ttft_mean_ms >= 3", "comparisons are only allowed"),
    ("a // b", "FloorDiv is not allowed"),
    ("not a", "unary Not is not allowed"),
    ("log(a, b)", r"log\(\) takes exactly 1"),
    ("max(a)", r"max\(\) takes at least 2"),
    ("max(a, key=b)", "only the functions"),
    ("a[b]", "metric lookups are"),
    ("a +", "cannot parse"),
    ("", "non-empty expression"),
])
def test_forbidden_constructs_are_rejected(text, match):
    if match is None:
        e = compile_expression(text)
        with pytest.raises(ExpressionError, match="unknown metric 'ttft_mean_ms.__class__'"):
            e.evaluate(METRICS)
        return
    with pytest.raises(ExpressionError, match=match):
        compile_expression(text, "--objective")


@pytest.mark.parametrize("text, margin, holds", [
    ("slo_attainment >= 0.99", 0.95 - 0.99, False),
    ("slo_attainment >= 0.95", 0.0, True),
    ("slo_attainment > 0.95", 0.0, False),
    ("ttft_mean_ms <= 300", 50.0, True),
    ("ttft_mean_ms < 250", 0.0, False),
    ("2 * ttft_mean_ms <= e2e_p99_ms", 700.0, True),
])
def test_constraint_margins(text, margin, holds):
    c = compile_constraint(text)
    m = c.margin(METRICS)
    assert m == pytest.approx(margin)
    assert c.holds(m) is holds


def test_constraint_must_be_a_single_comparison():
    for text in ("slo_attainment", "0.9 <= slo_attainment <= 1", "a == 1", "a != 1"):
        with pytest.raises(ExpressionError, match="must be one comparison"):
            compile_constraint(text, "--constraint")
    with pytest.raises(ExpressionError, match="--constraint"):
        compile_constraint("foo(a) >= 1", "--constraint")
    assert compile_constraint("a >= b + 1").names == ("a", "b")
