"""The program language: what parses, what is refused (naming the field), printing, trees and
the instruction form (docs/policy-programs.md)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from blisjax.config import ConfigError, SimConfig
from blisjax.config.policy import AdmissionConfig, PolicyConfig, RoutingConfig
from blisjax.program import (
    MAX_PROGRAM_LENGTH,
    Node,
    ProgramError,
    compile_program,
    parse,
    to_text,
)
from blisjax.program.bytecode import Op, assemble
from blisjax.program.observables import OBSERVABLES, index_of, visible_at
from tests.program.random_programs import random_program


def test_precedence_and_folds_follow_python():
    # a + b * c: the product first; min of three folds left; a < b < c is (a<b) and (b<c)
    n = parse("queue_depth + 2 * in_flight", path="p")
    assert n.op == "add" and n.args[1].op == "mul"
    n = parse("min(1, 2, 3)", path="p")
    assert n == Node("min", (Node("min", (Node("const", value=1.0), Node("const", value=2.0))),
                             Node("const", value=3.0)))
    n = parse("1 < queue_depth <= 4", path="p")
    assert n.op == "and" and [a.op for a in n.args] == ["lt", "le"]
    assert parse("-3", path="p") == Node("const", value=-3.0)
    assert parse("+queue_depth", path="p") == Node("name", name="queue_depth")


@pytest.mark.parametrize(("text", "says"), [
    ("queue_depth ** 2", "BinOp is not allowed"),
    ("queue_depth % 2", "BinOp is not allowed"),
    ("sqrt(queue_depth)", "function 'sqrt' is not allowed"),
    ("clip(queue_depth, 1)", "clip() takes 3 argument(s), got 2"),
    ("max(queue_depth)", "max() takes two or more arguments, got 1"),
    ("queue_depth.real", "Attribute is not allowed"),
    ("'a'", "only numbers are constants"),
    ("True", "only numbers are constants"),
    ("1e999", "is not finite"),
    ("queue_depth in (1, 2)", "comparison In is not allowed"),
    ("lambda: 1", "Lambda is not allowed"),
    ("queue_depth +", "does not parse"),
])
def test_refused_constructs_name_the_field(text, says):
    with pytest.raises(ProgramError, match=re.escape(says)) as e:
        compile_program("routing", program=text)
    assert str(e.value).startswith("policy.routing.program:")


def test_names_are_checked_against_the_site():
    assert "queue_depth" in visible_at("routing") and "queue_depth" not in visible_at("admission")
    assert "cluster_in_flight" not in visible_at("priority")
    with pytest.raises(ProgramError, match="'queue_depth' cannot be read by the admission"):
        compile_program("admission", program="queue_depth")
    with pytest.raises(ProgramError, match="'cluster_kv_utilization' cannot be read by the pri"):
        compile_program("priority", program="cluster_kv_utilization")
    with pytest.raises(ProgramError, match="'w' is neither an observable"):
        compile_program("priority", program="w * age_ms")
    assert compile_program("priority", program="w * age_ms", params={"w": 2}).params == \
        (("w", 2.0),)
    with pytest.raises(ProgramError, match="params.queue_depth: is an observable's name"):
        compile_program("routing", program="queue_depth", params={"queue_depth": 1})
    with pytest.raises(ProgramError, match="params.w: must be a finite number"):
        compile_program("routing", program="w", params={"w": float("nan")})


def test_the_length_limit_is_an_error_naming_it():
    # each "+ in_flight" adds two instructions: 1 + 2k instructions for k terms
    fits = " + ".join(["in_flight"] * ((MAX_PROGRAM_LENGTH + 1) // 2))
    assert len(assemble(parse(fits, path="p"), {})) == MAX_PROGRAM_LENGTH - 1
    over = fits + " + in_flight"
    with pytest.raises(ProgramError, match=f"compiles to {MAX_PROGRAM_LENGTH + 1} instructions; "
                                           f"at most {MAX_PROGRAM_LENGTH}"):
        compile_program("routing", program=over)


def test_instructions_are_children_first_with_params_bound():
    code = assemble(parse("clip(queue_depth, lo, 3) if w else -in_flight", path="p"),
                    {"lo": 0.5, "w": 1.0})
    q, lo = index_of("queue_depth"), index_of("in_flight")
    assert code == [(Op.CONST, 0, 0, 0, 1.0),            # w
                    (Op.OBS, q, 0, 0, 0.0),              # queue_depth
                    (Op.CONST, 0, 0, 0, 0.5),            # lo
                    (Op.CONST, 0, 0, 0, 3.0),
                    (Op.MAX, 1, 2, 0, 0.0),              # clip = min(max(x, lo), hi)
                    (Op.MIN, 4, 3, 0, 0.0),
                    (Op.OBS, lo, 0, 0, 0.0),
                    (Op.NEG, 6, 0, 0, 0.0),
                    (Op.SELECT, 0, 5, 7, 0.0)]


def _fold_negated_constants(node: Node) -> Node:
    """``-c`` parses as the constant -c (the same value as negating c): the one rewrite
    parsing makes."""
    args = tuple(_fold_negated_constants(a) for a in node.args)
    if node.op == "neg" and args[0].op == "const":
        return Node("const", value=-args[0].value)
    return Node(node.op, args, node.value, node.name)


def test_printing_parses_back_to_the_same_tree():
    rng = np.random.default_rng(7)
    for site in ("routing", "admission", "priority"):
        for _ in range(300):
            node = random_program(rng, site)
            assert parse(to_text(node), path="p") == _fold_negated_constants(node), \
                to_text(node)


def test_a_tree_is_its_if_expression_and_prints_as_a_tree():
    tree = {"if": "kv_utilization > t", "then": "-in_flight",
            "else": {"if": "cached_blocks > 0", "then": "cached_blocks", "else": 0}}
    p = compile_program("routing", tree=tree, params={"t": 0.8})
    assert p.text == ("-in_flight if kv_utilization > t else cached_blocks if cached_blocks > 0 "
                      "else 0")
    assert p.tree == ("if kv_utilization > t:\n    -in_flight\nelse:\n    if cached_blocks > 0:\n"
                      "        cached_blocks\n    else:\n        0")
    with pytest.raises(ProgramError, match=r"policy.routing.tree.else: a tree node needs exactly"):
        compile_program("routing", tree={"if": "1", "then": 1, "else": {"if": "1", "then": 2}})


def test_configuration_fields():
    r = RoutingConfig(policy="program", tree={"if": "queue_depth < w", "then": "in_flight",
                                              "else": 0}, params={"w": 3})
    assert (r.program, r.tree, r.params) == ("in_flight if queue_depth < w else 0", None,
                                             (("w", 3.0),))
    assert r.compiled().reads == ("in_flight", "queue_depth")
    with pytest.raises(ConfigError, match="policy.routing.program: policy 'program' needs"):
        RoutingConfig(policy="program")
    with pytest.raises(ConfigError, match="policy.admission: give program or tree, not both"):
        AdmissionConfig(policy="program", program="1", tree={"if": 1, "then": 1, "else": 0})
    with pytest.raises(ConfigError, match="policy.admission.params: parameters need a program"):
        AdmissionConfig(params={"w": 1})
    # a program may ride along with a template (a search switching policies keeps it)
    assert RoutingConfig(policy="weighted", program="in_flight").compiled() is not None


def test_observable_table_is_consistent():
    names = [o.name for o in OBSERVABLES]
    assert len(names) == len(set(names))
    assert all(index_of(n) == k for k, n in enumerate(names))
    assert set(visible_at("priority")) < set(visible_at("admission")) < set(visible_at("routing"))


def test_programs_are_refused_with_pd_pools():
    from blisjax.config import load_config

    cfg = load_config("configs/search/pd-split.yaml")
    routing = RoutingConfig(policy="program", program="-in_flight")
    with pytest.raises(ConfigError, match="policy.routing.policy: 'program' is not available "
                                          "with P/D pools"):
        SimConfig(**{**cfg.__dict__, "policy": PolicyConfig(routing=routing)})
