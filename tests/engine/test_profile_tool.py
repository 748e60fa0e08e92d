"""The profiler attribution of ``benchmarks/profile_engine.py``: the hand-written decoding of a
compiled module's stack-frame index, and exclusive times of nested trace events."""

from __future__ import annotations

import inspect
import re

import jax
import jax.numpy as jnp

from tests.paths import REPO, benchmark_script


def _tool():
    return benchmark_script("profile_engine")


def _inner(x):
    return jnp.sin(x) * 3.0


def _outer(x):
    return _inner(x) + 1.0


def test_stack_frames_of_a_compiled_module_name_the_python_calls():
    tool = _tool()
    module = jax.jit(_outer).lower(jnp.ones(4)).compile().runtime_executable().hlo_modules()[0]
    stack = tool.stack_resolver(module.as_serialized_hlo_module_proto())
    sine_line = inspect.getsourcelines(_inner)[1] + 1  # the line of jnp.sin
    outer_line = inspect.getsourcelines(_outer)[1] + 1
    frames = {int(m) for m in re.findall(r"stack_frame_id=(\d+)", module.to_string())}
    stacks = [stack(f) for f in frames]
    here = "test_profile_tool.py"
    assert [(here, "_inner", sine_line), (here, "_outer", outer_line)] in \
        [s[:2] for s in stacks]


def test_exclusive_times_subtract_nested_events_per_thread():
    tool = _tool()
    events = [  # a loop [0, 10) running kernels a [1, 3) and b [4, 8); c on another thread
        dict(pid=1, tid=1, ts=0, dur=10, name="loop"),
        dict(pid=1, tid=1, ts=1, dur=2, name="a"),
        dict(pid=1, tid=1, ts=4, dur=4, name="b"),
        dict(pid=1, tid=2, ts=2, dur=5, name="c"),
        dict(pid=1, tid=1, ts=12, dur=1, name="a"),
    ]
    excl, count = tool.exclusive_times(events)
    assert dict(excl) == {"loop": 4, "a": 3, "b": 4, "c": 5}
    assert dict(count) == {"loop": 1, "a": 2, "b": 1, "c": 1}


HLO = """\
%body.1 (arg: (s32[4,2001], s32[4,3])) -> (s32[4,2001], s32[4,3]) {
  %gte.1 = s32[4,2001]{1,0} get-tuple-element(%arg), index=0
  %copy.7 = s32[4,2001]{1,0} copy(%gte.1)
  %copy.8 = s32[4,3]{1,0} copy(%gte.1)
  %gather.2 = s32[4,1]{1,0} gather(%copy.7, %idx), metadata={op_name="x" stack_frame_id=5}
}

ENTRY %main.9 (p: s32[4,2001]) -> s32[4,2001] {
  %copy.1 = s32[4,2001]{1,0} copy(%p)
}
"""


def test_hlo_copies_lists_large_copies_in_loop_bodies_with_their_users(monkeypatch):
    """``hlo_copies.py``: a copy of 8,004 elements in a loop body is listed, a small one and
    one in the entry computation are not, and its user's engine frames are named."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    tool = benchmark_script("hlo_copies")
    assert tool._elements("s32[4,2001]{1,0}") == 8004 and tool._elements("(s32[2], f64[])") == 0
    copies = tool.loop_copies(HLO, min_elements=8000)
    assert copies == [("body.1", "copy.7", "s32[4,2001]{1,0}")]

    def stack(frame_id):
        assert frame_id == 5
        return [("stretch.py", "_apply", 263), ("elsewhere.py", "f", 1),
                ("lockstep.py", "lane_while", 41)]

    users = tool.engine_lines(HLO, {"copy.7"}, stack)
    assert dict(users) == {"stretch.py:_apply:263 < lockstep.py:lane_while:41": 1}
