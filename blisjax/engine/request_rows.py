"""Host-side counts of each request of the engine's workload: the blocks it shares with its
prefix group or session, the hash slots and CPU keys of its own blocks, its ITL samples and α
delay, and the most requests between routing and enqueue at once. ``static.build_static``
sizes the program from them and ``consts.build_consts`` lays out the per-request constants.

Counterpart: the quantities ``blisjax.reference`` computes per ``SimRequest`` as it runs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from blisjax.latency.blackbox import blackbox_queueing_delay_us
from blisjax.workload.sessions import content_tokens, prompt_tokens


def itl_counts(out, pd: bool) -> np.ndarray:
    """Raw ITL entries per request: one per output token after the first; with P/D pools at
    least one (a decode sub-request's first step decodes a token even with one output)."""
    return np.maximum(np.asarray(out, np.int64) - 1, 1 if pd else 0)


#: ITL entries a decode-stretch pass writes per request as one window
#: per ``ITL_WINDOW`` steps (``stretch._itl_windows``; at least ``stretch.CHUNK_STEPS``).
ITL_WINDOW = 16


def itl_allotted(out, pd: bool) -> np.ndarray:
    """Raw ITL entries held per request in the ITL buffer, end to end: its ``itl_counts``
    and ``ITL_WINDOW - 1`` more (at least ``ITL_WINDOW``), so that a window that starts at
    any of its entries covers no other request's."""
    return np.maximum(itl_counts(out, pd) + (ITL_WINDOW - 1), ITL_WINDOW)


def ext_counts(inp, out, bs: int) -> np.ndarray:
    """CPU extension keys per request: its block-table positions past its full prompt blocks,
    ``ceil((L_in mod B + N_out + 1) / B)``, counted by their bound ``ceil(N_out / B) + 1`` so
    that a workload with outputs at least as long bounds them whatever the prompts (an
    envelope workload shares its program, ``build_static_shared``)."""
    del inp  # the bound does not depend on the prompt
    return -(-np.asarray(out, np.int64) // bs) + 1


def engine_workload(workload, max_model_len: int, *, pd: bool):
    """The workload as the engine reads it: every prompt at its assembled length
    (``workload.sessions.prompt_tokens`` under the cap ``max_model_len`` of the instances where
    rounds complete, ``pd``: with P/D pools; the workload itself without sessions)."""
    if not workload.has_sessions:
        return workload
    return dataclasses.replace(workload, input_tokens=prompt_tokens(
        workload, max_model_len, disaggregated=pd))


def own_counts(workload, bs: int) -> np.ndarray:
    """Hash slots of each request's own blocks: its full prompt blocks past its prefix
    group's; none for a request of an accumulating session (all its blocks are shared)."""
    inp = np.asarray(workload.input_tokens, dtype=np.int64)
    own = inp // bs - group_blocks(workload, bs)
    if workload.session_accumulate:
        own = np.where(workload.session >= 0, 0, own)
    return own


def session_tokens(workload) -> np.ndarray:
    """Leading tokens of each request that its session shares (``sessions.content_tokens``
    of the assembled prompts, ``engine_workload``)."""
    return content_tokens(workload, np.asarray(workload.input_tokens, dtype=np.int64))


def session_blocks(workload, bs: int) -> np.ndarray:
    """Leading blocks of each request that its session shares."""
    return session_tokens(workload) // bs


def queue_delays(resolved, workload) -> np.ndarray:
    """Per-request α delay (blackbox and roofline: state-free; physics: computed per routing
    event on the host, zeros here)."""
    if resolved.config.latency.model == "physics":
        return np.zeros(workload.num_requests, np.int64)
    alpha = tuple(resolved.alpha)
    return np.array([blackbox_queueing_delay_us(alpha, int(x)) for x in workload.input_tokens],
                    dtype=np.int64)


def max_pending(resolved, workload, others=()) -> int:
    """Most requests that can be between routing and enqueue at once, on any instance.

    Request r is routed at arrival + admission + routing latency (fixed offsets) and enqueued
    exactly ``queue_delay_us[r]`` later; both ends count (routing precedes enqueue at equal
    times). The slots the kernel scans per event are this bound, not the request count.
    ``others``: resolved configurations some instances run (P/D pools of their own): each
    request's window is then the longest of its delays under any of them.
    """
    if workload.num_requests == 0 or resolved.config.latency.model == "physics":
        return max(workload.num_requests, 1)
    if workload.has_sessions:  # a follow-up's window may overlap any other: one per session
        initial = ~workload.follow_up
        rows = {f.name: getattr(workload, f.name)[initial] for f in dataclasses.fields(workload)
                if isinstance(getattr(workload, f.name), np.ndarray)}
        rows.update(session=None, round_index=None, think_time_us=None)
        plain = dataclasses.replace(workload, **rows, session_names=(),
                                    session_accumulate=False, session_unbounded=(),
                                    follow_up_budget=-1)
        return max_pending(resolved, plain, others) + len(workload.session_names)
    cl = resolved.config.cluster
    start = np.asarray(workload.arrival_us, np.int64) + cl.admission_latency_us \
        + cl.routing_latency_us
    delays = queue_delays(resolved, workload)
    for other in others:
        delays = np.maximum(delays, queue_delays(other, workload))
    end = np.sort(start + delays)
    start = np.sort(start)
    # overlap peaks at some start: routed by then minus enqueued strictly before then
    live = np.searchsorted(start, start, "right") - np.searchsorted(end, start, "left")
    return int(live.max()) + 1


def group_blocks(workload, bs: int) -> np.ndarray:
    grp = np.asarray(workload.prefix_group)
    pl = np.asarray(workload.prefix_length, dtype=np.int64)
    return np.where(grp >= 0, np.minimum(pl // bs, np.asarray(workload.input_tokens) // bs), 0)
