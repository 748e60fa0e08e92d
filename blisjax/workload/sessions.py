"""Closed-loop multi-turn sessions: what both engines derive from a session workload.

A session is a conversation: its round 0 arrives like any request; each later round (a
*follow-up*) is created when its predecessor completes and arrives a think time later, with the
conversation so far as the start of its prompt (BLIS ``blis replay --session-mode closed-loop``,
``sim/workload/session.go``; docs/semantics.md §8.5). A follow-up's row exists in the workload
from the start (``Workload.follow_up``), so shapes are fixed; its arrival is a simulation result.

Rules (BLIS's):

* **Prompt.** With ``session_accumulate`` round k's prompt is round k−1's prompt, the tokens
  round k−1 produced except its last (``PI − L`` at completion: ``max(N_out, 1) − 1``, or up to
  the length cap ``max_model_len − 1`` when capped), then round k's message. Without it, the
  round's prompt is the shared prefix plus its message.
* **Arrival** = the predecessor's completion (the end of the step that completed it) + the
  round's think time; a follow-up arriving after the horizon is not created, nor is any after a
  round that timed out, was dropped or was rejected (the session is cancelled).
* **Deadline** = arrival + the row's timeout (``Workload.deadline_us`` of a follow-up is
  relative; a closed-loop trace replay gives every follow-up ``FOLLOW_UP_TIMEOUT_US``, BLIS's
  default, whatever round 0's deadline was); 0 = none.
* **Order.** A follow-up's cluster arrival event is created when it is generated, so at equal
  times it comes after every request of the workload's initial rows and after the follow-ups
  generated before it.
* **Content** (prefix caching, ``content_tokens``): with ``session_accumulate`` a round's first
  ``L + max(N_out, 1) − 1`` tokens are the conversation's, shared with every other round of the
  session that reaches them; only the last output token is the request's own.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from blisjax.workload.types import FOLLOW_UP_ARRIVAL_US, NO_SESSION, Workload

__all__ = ["FOLLOW_UP_TIMEOUT_US", "content_tokens", "next_round", "prompt_tokens", "realized"]

#: A replayed follow-up's timeout after its arrival, µs (BLIS's default request timeout).
FOLLOW_UP_TIMEOUT_US = 300_000_000


def next_round(workload: Workload) -> np.ndarray:
    """int64 [N]: the row of each request's next round in its session, -1 for none."""
    w = workload
    out = np.full(w.num_requests, -1, dtype=np.int64)
    if not w.has_sessions:
        return out
    follow = np.flatnonzero(w.follow_up)
    prev_of: dict[tuple[int, int], int] = {}
    for i in np.flatnonzero(w.session != NO_SESSION).tolist():
        prev_of[(int(w.session[i]), int(w.round_index[i]))] = i
    for i in follow.tolist():
        out[prev_of[(int(w.session[i]), int(w.round_index[i]) - 1)]] = i
    return out


def produced_tokens(prompt: int, output_tokens: int, max_model_len: int, *,
                    disaggregated: bool = False) -> int:
    """Tokens a completed request produced that enter the conversation (``PI − L`` at its
    completion): all but the last, or up to the length cap when it was capped.

    ``disaggregated``: rounds may complete as P/D decode sub-requests, which pass no length
    guard on their decode instance and whose first step decodes a token whatever the cap: a
    round of two or more output tokens whose prompt reaches the cap (it would be unservable
    co-located, and is dropped there) then produces one."""
    made = max(output_tokens, 1) - 1
    if max_model_len > 0 and prompt + made > max_model_len - 1:
        made = max(max_model_len - 1 - prompt, min(made, 1) if disaggregated else 0)
    return made


def prompt_tokens(workload: Workload, max_model_len: int, *,
                  disaggregated: bool = False) -> np.ndarray:
    """int64 [N]: each request's prompt length as the engines see it (``Workload.input_tokens``
    for every row but a follow-up, whose prompt is assembled from its session). A follow-up
    whose predecessor cannot complete normally (an unservable prompt) keeps a well-defined
    length; it is never created. ``max_model_len``: the cap of the instances where rounds
    complete (``ResolvedConfig.conversation_max_model_len``); ``disaggregated``: with P/D
    pools (``produced_tokens``)."""
    w = workload
    prompt = np.asarray(w.input_tokens, dtype=np.int64).copy()
    if not w.has_sessions:
        return prompt
    nxt = next_round(w)
    for i in np.flatnonzero(nxt >= 0).tolist():  # rounds come in order: row i before nxt[i]
        k = int(nxt[i])
        if w.session_accumulate:
            made = produced_tokens(int(prompt[i]), int(w.output_tokens[i]), max_model_len,
                                   disaggregated=disaggregated)
            prompt[k] = prompt[i] + made + w.input_tokens[k]
        else:
            prompt[k] = w.prefix_length[k] + w.input_tokens[k]
    return prompt


def content_tokens(workload: Workload, prompts: np.ndarray) -> np.ndarray:
    """int64 [N]: the leading tokens of each request that belong to its session's conversation
    (0 outside an accumulating session): a full block lying within them has the same content
    in every round of the session that holds it (``blisjax.blockhash.block_code``)."""
    w = workload
    if not (w.has_sessions and w.session_accumulate):
        return np.zeros(w.num_requests, dtype=np.int64)
    own = prompts + np.maximum(np.asarray(w.output_tokens, np.int64), 1) - 1
    return np.where(w.session != NO_SESSION, own, 0)


def realized(workload: Workload, arrival_us: np.ndarray, prompts: np.ndarray) -> Workload:
    """The workload as a run saw it: follow-ups with the arrival the run gave them
    (``FOLLOW_UP_ARRIVAL_US`` for those never created) and every prompt at its assembled
    length. Used for metrics and per-request rows."""
    arrival = np.where(workload.follow_up, np.asarray(arrival_us, np.int64),
                       workload.arrival_us)
    arrival = np.where(arrival < 0, FOLLOW_UP_ARRIVAL_US, arrival)
    return dataclasses.replace(workload, arrival_us=arrival,
                               input_tokens=np.asarray(prompts, np.int64))
