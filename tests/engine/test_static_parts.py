"""``EngineStatic``'s four parts: every field in one part, built and changed by name."""

from __future__ import annotations

import dataclasses

import pytest

from blisjax.engine.instance import step_widths
from blisjax.engine.static import (
    FIELD_GROUP,
    EngineStatic,
    Features,
    Settings,
    Shapes,
    Tuning,
    batch_slots_for,
    build_static,
)
from tests.reference.conftest import make_resolved, make_workload

ROWS = [dict(arrival=0, input=40, output=4), dict(arrival=50, input=24, output=9)]


def _static() -> EngineStatic:
    return build_static(make_resolved(instances=2, block_size=4, kv_blocks=40, max_running=4),
                        make_workload(ROWS))


def test_every_field_belongs_to_exactly_one_part():
    parts = {"shapes": Shapes, "settings": Settings, "features": Features, "tuning": Tuning}
    names = [f.name for cls in parts.values() for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names)) == len(FIELD_GROUP)
    assert [f.name for f in dataclasses.fields(EngineStatic)] == list(parts)
    for name, part in FIELD_GROUP.items():
        assert name in {f.name for f in dataclasses.fields(parts[part])}


def test_a_static_rebuilt_from_its_fields_is_equal_and_hashes_alike():
    st = _static()
    again = EngineStatic.of(**st.fields())
    assert again == st and hash(again) == hash(st)
    # the values of the configuration, each in its part
    assert (st.shapes.num_requests, st.shapes.num_instances, st.shapes.kv_blocks) == (2, 2, 40)
    # 4 running requests configured, but two requests can never fill more than 2 slots
    assert (st.shapes.batch_slots, st.settings.block_size) == (2, 4)
    assert not st.features.pd and st.field("block_size") == 4


def test_replace_changes_the_named_fields_in_their_parts_only():
    st = _static()
    other = st.replace(queue_slots=9, blis_quirks=True, pd=True, running_width=1)
    assert (other.shapes.queue_slots, other.settings.blis_quirks) == (9, True)
    assert (other.features.pd, other.tuning.running_width) == (True, 1)
    changed = {k for k, v in other.fields().items() if st.field(k) != v}
    assert changed == {"queue_slots", "blis_quirks", "pd", "running_width"}
    assert other.request_rows == 2 * st.request_rows - 1  # P/D rows: N + 1 + N


@pytest.mark.parametrize("build", [lambda st: EngineStatic.of(**st.fields(), kv_block=3),
                                   lambda st: st.replace(kv_block=3)])
def test_an_unknown_field_is_named_in_the_error(build):
    with pytest.raises(TypeError, match="EngineStatic has no field 'kv_block'"):
        build(_static())


@pytest.mark.parametrize(("requests", "max_running", "pd", "slots"), [
    (2, 4, False, 2), (2, 4, True, 4), (2, 3, True, 3), (300, 256, False, 256),
    (0, 256, False, 1)])
def test_batch_slots_are_the_running_cap_or_the_rows_that_could_run(requests, max_running, pd,
                                                                   slots):
    # with P/D pools a request is two rows (its prefill and decode sub-requests)
    assert batch_slots_for(max_running, requests, pd=pd) == slots


def test_a_small_workload_compiles_one_narrow_step_program():
    st = build_static(make_resolved(instances=2, block_size=4, kv_blocks=40, max_running=256),
                      make_workload(ROWS))
    assert (st.shapes.batch_slots, st.tuning.running_width) == (2, 2)
    assert st.every_row_runs and step_widths(st, 2) == (2,)
