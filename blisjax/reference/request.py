"""Mutable per-request simulation state of the reference engine."""

from __future__ import annotations

from blisjax.metrics.records import NOT_RECORDED, Stage

PD_WHOLE, PD_PREFILL, PD_DECODE = 0, 1, 2  # ``SimRequest.pd_part``


class SimRequest:
    """One request: static facts from the workload plus its evolving state."""

    __slots__ = (
        "index", "arrival_us", "input_tokens", "output_tokens", "prefix_group", "prefix_length",
        "tenant", "slo_class", "deadline_us", "state", "instance", "progress_index",
        "num_new_tokens", "computed_tokens", "priority", "ttft_set", "ttft_us", "itl_us",
        "scheduling_delay_us", "preemptions", "e2e_us", "output_tokens_done", "length_capped",
        "block_hashes", "max_output_len", "pd_part", "left_us", "route_order", "session",
        "session_tokens",
    )

    def __init__(self, index: int, arrival_us: int, input_tokens: int, output_tokens: int,
                 prefix_group: int, prefix_length: int, tenant: int, slo_class: int,
                 deadline_us: int) -> None:
        self.index = index
        self.arrival_us = arrival_us
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.prefix_group = prefix_group
        self.prefix_length = prefix_length
        self.tenant = tenant
        self.slo_class = slo_class
        self.deadline_us = deadline_us
        self.state = Stage.PENDING
        self.instance = -1
        self.progress_index = 0  # BLIS ProgressIndex: tokens processed (prompt, then outputs)
        self.num_new_tokens = 0  # tokens scheduled in the current step
        self.computed_tokens = 0  # BLIS ComputedTokens[id]
        self.priority = 0.0  # higher = more urgent; recomputed at each step while queued
        self.ttft_set = False
        self.ttft_us = NOT_RECORDED
        self.itl_us: list[int] = []
        self.scheduling_delay_us = NOT_RECORDED
        self.preemptions = 0
        self.e2e_us = NOT_RECORDED
        self.output_tokens_done = 0
        self.length_capped = False
        self.block_hashes: list[int] | None = None  # filled lazily by the cluster
        self.max_output_len = output_tokens  # output budget of the enqueue guards
        self.pd_part = PD_WHOLE  # P/D: the whole request, or one of its sub-requests
        self.left_us = NOT_RECORDED  # end of the step it completed in, or its timeout
        self.route_order = 0  # routings before its last one (a redirect drain's order)
        self.session = -1  # its closed-loop session (``Workload.session``), -1: none
        self.session_tokens = 0  # leading tokens shared with its conversation (content_tokens)

    def sub_request(self, part: int) -> SimRequest:
        """A P/D sub-request of this request (docs/semantics.md §5.10): the same index, arrival,
        prompt, prefix, tenant, class, deadline and conversation; the prefill part has no output tokens (its
        enqueue guards still count the whole output budget), the decode part all of them."""
        sub = SimRequest(self.index, self.arrival_us, self.input_tokens,
                         0 if part == PD_PREFILL else self.output_tokens, self.prefix_group,
                         self.prefix_length, self.tenant, self.slo_class, self.deadline_us)
        sub.max_output_len = self.output_tokens
        sub.pd_part = part
        sub.block_hashes = self.block_hashes
        sub.session, sub.session_tokens = self.session, self.session_tokens  # its KV's names
        return sub
