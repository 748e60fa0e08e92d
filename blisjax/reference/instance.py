"""One vLLM-style instance: α delay, wait queue, continuous batching, KV cache, preemption.

Implements docs/semantics.md §1.2–§2.9 literally; section numbers in comments refer to it.
Instance events are ordered by (time, event priority, sequence number), sequence numbers per
instance starting at 1.
"""

from __future__ import annotations

import heapq
from collections import deque

from blisjax.config.codes import PreemptionPolicy, SchedulerPolicy
from blisjax.latency.base import StepBatch
from blisjax.metrics import records
from blisjax.metrics.records import Stage
from blisjax.reference.kvcache import KVCache, TieredKVCache
from blisjax.reference.policies import reorder_wait_queue
from blisjax.reference.program import RecentSignals
from blisjax.reference.request import PD_DECODE
from blisjax.rules import KV_UTIL_BUCKETS, kv_util_bucket

# Instance event priorities (§1.2).
EV_ARRIVAL, EV_QUEUED, EV_STEP, EV_TIMEOUT = 0, 1, 3, 6


class Instance:
    """Plain-Python instance simulator; the cluster drives it one event at a time."""

    def __init__(self, index: int, *, engine, total_kv_blocks: int, max_model_len: int,
                 latency, priority, scheduler: SchedulerPolicy, horizon_us: int, hash_of,
                 blis_quirks: bool = False, hash_at=None, thrash_window_us: int = 0) -> None:
        self.index = index
        self.engine = engine
        self.total_kv_blocks = total_kv_blocks
        self.hash_of, self.hash_at = hash_of, hash_at
        self.thrash_window_us = thrash_window_us
        # a warming-up instance's steps take this factor longer (docs/semantics.md Decision 12)
        self.step_factor = 1.0
        self.max_running = engine.max_num_running_reqs
        self.max_batched_tokens = engine.max_num_scheduled_tokens
        self.block_size = engine.block_size_tokens
        self.long_prefill_threshold = engine.long_prefill_token_threshold
        self.preemption_policy = PreemptionPolicy.of(engine.preemption_policy)
        self.max_model_len = max_model_len
        self.own_latency = latency  # its configuration's (``set_latency``)
        self.latency = latency
        self.otp_us = latency.output_token_processing_us
        self.post_decode_us = latency.post_decode_overhead_us
        self.priority = priority
        self.scheduler = scheduler
        self.horizon_us = horizon_us
        self.kv = self._new_kv_cache()
        self.tiered = engine.kv_cpu_blocks > 0
        # Decision 12: by default an admission reloads before its prefill is sized (reloaded
        # blocks count as cached in that step) and keeps its own cached blocks while it
        # reloads; BLIS (the quirk) does neither
        self.reload_before_sizing = self.tiered and not blis_quirks
        # Decision 22: a step that admits nothing with nothing running waits for an event
        # instead of stepping again (its wait queue cannot change order with time alone);
        # BLIS (the quirk) steps empty until the horizon
        self.waits_when_stalled = not blis_quirks and (
            scheduler == SchedulerPolicy.FCFS or priority.is_constant)
        self.stalled = False  # its last step admitted nothing and nothing ran: no step pending
        self.events: list = []
        self.seq = 0
        self.clock_us = 0  # time of the last executed event
        self.last_left_us = 0  # latest RequestLeft time within the horizon
        self.wait_queue: deque = deque()
        self.running: list = []
        self.step_pending = False
        self.finished: list = []  # requests that completed/dropped/timed out since last drained
        # counters
        self.completed = 0
        self.dropped_unservable = 0
        self.timed_out = 0
        self.length_capped = 0
        self.dropped_at_drain = 0
        self.total_input_tokens = 0
        self.preemption_count = 0
        self.kv_allocation_failures = 0  # final tokens that found no KV block
        self.step_count = 0
        self.busy_time_us = 0
        self.queue_depth_time_us = 0
        self.peak_kv_blocks_used = 0
        self.kv_block_time_us = 0  # Σ used blocks × step duration (KV utilization over time)
        # µs of steps by the whole percent of the KV blocks in use (``rules.kv_util_bucket``)
        self.kv_util_time_us = [0] * (KV_UTIL_BUCKETS + 1)
        self.itl_entries: list[int] = []
        self.itl_entry_rows: list[int] = []  # the request of each entry
        self._budget = 0
        self._preempted_this_step = False
        # Physics-normalized latency reads instance state (queue depths, KV usage, preemptions).
        self.stateful_latency = hasattr(latency, "step_inputs")
        self.preemption_ema = 0.0
        self._preempted_count_step = 0
        self._admitted_cached_tokens: dict[int, int] = {}
        self.recent = RecentSignals()  # what routing programs read (reference.program)
        # Optional observer (tracing / latency fitting): on_queue(...) and on_step(...) get the
        # state a latency model sees; it must not change the simulation.
        self.observer = None
        # Decision trace collector (blisjax.trace.TraceCollector) or None: it reads, never writes
        self.trace = None

    def _new_kv_cache(self) -> KVCache:
        engine = self.engine
        if engine.kv_cpu_blocks > 0:
            return TieredKVCache(self.total_kv_blocks, self.block_size, self.hash_of,
                                 engine.kv_cpu_blocks, engine.kv_transfer_bandwidth,
                                 engine.kv_transfer_base_latency_us, self.hash_at,
                                 self.thrash_window_us)
        return KVCache(self.total_kv_blocks, self.block_size, self.hash_of,
                       engine.enable_prefix_caching, hash_at=self.hash_at)

    # ---- lifecycle (Decision 16) -----------------------------------------------------------
    def set_latency(self, latency) -> None:
        """The latency model of the instance placed in this slot: its node pool's GPU's, or
        (None) its configuration's."""
        latency = self.own_latency if latency is None else latency
        self.latency = latency
        self.otp_us = latency.output_token_processing_us
        self.post_decode_us = latency.post_decode_overhead_us

    def restart(self) -> None:
        """A new instance in this slot: empty caches and no preemption history; the slot's
        counters carry on."""
        old = self.kv
        self.kv = self._new_kv_cache()
        self.kv.carry_counters(old)  # the slot's counters, CPU tier's included
        self.preemption_ema = 0.0
        self.step_factor = 1.0
        self.recent = RecentSignals()
        # a new instance has no step pending; a completed request's lazily cancelled timeout
        # stays, an event that changes nothing (the JAX engine's deadline no-op)
        self.events = [e for e in self.events if e[1] == EV_TIMEOUT]
        heapq.heapify(self.events)
        self.step_pending = False
        self.stalled = False

    def _held_requests(self) -> list:
        """Requests the instance holds that are not running: inside their queueing delay
        (in routing order), then the wait queue (in queue order)."""
        arriving = [req for _, prio, _, req in self.events if prio in (EV_ARRIVAL, EV_QUEUED)]
        return sorted(arriving, key=lambda r: r.route_order) + list(self.wait_queue)

    def _forget(self, reqs: list) -> None:
        """Remove ``reqs`` and their pending events (a timeout included) from the instance."""
        gone = {id(r) for r in reqs}
        self.events = [e for e in self.events if e[3] is None or id(e[3]) not in gone]
        heapq.heapify(self.events)
        self.wait_queue = deque(r for r in self.wait_queue if id(r) not in gone)
        self.running = [r for r in self.running if id(r) not in gone]
        self.step_pending = any(e[1] == EV_STEP for e in self.events)

    def take_not_running(self) -> list:
        """Drain policy ``redirect``: hand back every request not yet running (in queueing
        delay, then queued), with no trace of it left here."""
        taken = self._held_requests()
        self._forget(taken)
        return taken

    def drop_everything(self, now_us: int) -> None:
        """Drain policy ``immediate``: every request held, running or not, is dropped and its
        KV released."""
        dropped = self._held_requests() + list(self.running)
        for r in dropped:
            self.kv.release(r)
            r.state = Stage.DROPPED
            r.left_us = now_us
            self.dropped_at_drain += 1
            self.finished.append(r)
        self._forget(dropped)

    # ---- event heap ------------------------------------------------------------------------
    def push(self, time_us: int, prio: int, req) -> None:
        self.seq += 1
        heapq.heappush(self.events, (time_us, prio, self.seq, req))

    def next_event_time(self) -> int | None:
        return self.events[0][0] if self.events else None

    def inject_arrival(self, req, time_us: int) -> None:
        """Routing hands a request over at ``time_us`` (BLIS InjectArrivalAt)."""
        req.instance = self.index
        self.push(time_us, EV_ARRIVAL, req)

    @staticmethod
    def cancelled(prio: int, req) -> bool:
        """A timeout whose request already left: lazily cancelled (§1.4)."""
        return prio == EV_TIMEOUT and req.state in (Stage.COMPLETED, Stage.TIMED_OUT)

    def process_next_event(self) -> None:
        time_us, prio, _, req = heapq.heappop(self.events)
        if self.cancelled(prio, req):
            return  # the clock does not advance
        self.clock_us = time_us
        if prio == EV_ARRIVAL:
            self.push(time_us + self._queueing_delay_us(req), EV_QUEUED, req)
        elif prio == EV_QUEUED:
            self._enqueue(req, time_us)
            if not self.step_pending and self.wait_queue:
                self.step_pending = True
                self.push(time_us, EV_STEP, None)
        elif prio == EV_STEP:
            self._step(time_us)
        else:
            self._timeout(req, time_us)

    def _queueing_delay_us(self, req) -> int:
        """α delay, computed when the instance receives the request (BLIS QueueingTime)."""
        delay = self._model_queueing_delay_us(req)
        if self.observer is not None:
            self.observer.on_queue(
                instance=self.index, request=req.index, time_us=self.clock_us, delay_us=delay,
                running_depth=len(self.running), waiting_depth=len(self.wait_queue),
                kv_used_blocks=self.kv.used_blocks, kv_total_blocks=self.kv.total_blocks,
                prompt_tokens=req.input_tokens,
                prefix_cached_blocks=len(self.kv.cached_blocks(req)),
                preemption_ema=self.preemption_ema)
        return delay

    def _model_queueing_delay_us(self, req) -> int:
        if not self.stateful_latency:
            return self.latency.queueing_delay_us(req.input_tokens)
        from blisjax.latency.physics import PhysicsQueueInputs

        inputs = PhysicsQueueInputs.from_state(
            self.latency.config, running_depth=len(self.running),
            waiting_depth=len(self.wait_queue), kv_used_blocks=self.kv.used_blocks,
            prompt_tokens=req.input_tokens, prefix_cached_blocks=len(self.kv.cached_blocks(req)),
            preemption_ema=self.preemption_ema)
        return self.latency.queueing_delay_us(inputs)

    # ---- enqueue (§2.1) ----------------------------------------------------------------------
    def _enqueue(self, req, now_us: int) -> None:
        l_in = req.input_tokens
        if records.unservable(l_in, req.max_output_len, self.max_model_len, self.kv.total_blocks,
                              self.block_size):
            req.state = Stage.DROPPED
            self.dropped_unservable += 1
            self.finished.append(req)
            return
        self.total_input_tokens += l_in
        self._join_queue(req, now_us)

    def _join_queue(self, req, now_us: int) -> bool:
        """The request joins the wait queue with its deadline's timeout, or times out at once
        (releasing any KV it holds) when its deadline has passed; True if it joined."""
        if 0 < req.deadline_us <= now_us:
            req.state = Stage.TIMED_OUT
            req.left_us = now_us
            self.timed_out += 1
            self.kv.release(req)
            self.finished.append(req)
            return False
        req.state = Stage.QUEUED
        self.wait_queue.append(req)
        if 0 < req.deadline_us <= self.horizon_us:
            self.push(req.deadline_us, EV_TIMEOUT, req)
        return True

    # ---- P/D decode sub-requests (§5.10) -----------------------------------------------------
    def reserve_transferred_kv(self, sub, now_us: int) -> bool:
        """Reserve KV for a decode sub-request whose prompt's KV is about to arrive: fresh
        blocks for its whole prompt (no prefix reuse; with a CPU tier the tiered allocation,
        which may reload), every block a miss, full blocks registered. On success the request
        holds them and its progress is its prompt; False (no change) when they do not fit."""
        sub.instance = self.index
        thrash = 0
        if self.tiered:  # evictions happen now (thrashing anomaly)
            self.kv.now_us = now_us
            thrash = self.kv.thrash_reloads
        reserved = self.kv.allocate(sub, 0, sub.input_tokens)
        if self.trace is not None and self.tiered and self.kv.thrash_reloads > thrash:
            self.trace.thrashing(self, now_us, self.kv.thrash_reloads - thrash,
                                 [self.trace.request_id(sub)])
        if not reserved:
            return False
        sub.progress_index = sub.input_tokens
        return True

    def enqueue_decode(self, sub, now_us: int) -> None:
        """A decode sub-request's KV has arrived: it joins the wait queue now (no queueing
        delay, its prompt tokens not counted again), with its deadline's timeout; a deadline
        already past times it out at once."""
        if self._join_queue(sub, now_us) and not self.step_pending:
            self.step_pending = True
            self.push(now_us, EV_STEP, None)

    # ---- timeout (§2.9) ----------------------------------------------------------------------
    def _timeout(self, req, now_us: int) -> None:
        was_running = req.state == Stage.RUNNING
        req.state = Stage.TIMED_OUT
        req.left_us = now_us
        self.timed_out += 1
        self.kv.release(req)
        req.computed_tokens = 0
        if was_running:
            self.running.remove(req)
        else:
            self.wait_queue.remove(req)
        self.finished.append(req)
        if not self.running and self.wait_queue and not self.step_pending:
            self.step_pending = True
            self.push(now_us, EV_STEP, None)

    # ---- one step (§2.2–§2.7) ----------------------------------------------------------------
    def _step(self, now_us: int) -> None:
        if not self.running and not self.wait_queue:
            self.step_pending = False  # a timeout emptied the instance; nothing to do
            return
        self.step_count += 1
        self.stalled = False
        if self.tiered:  # the tier's eviction and reload times (thrashing anomaly)
            self.kv.now_us = now_us
        if not self.priority.is_constant:
            for r in self.wait_queue:
                r.priority = self.priority.score(r, now_us)
        if self.scheduler != SchedulerPolicy.FCFS:
            self.wait_queue = deque(reorder_wait_queue(self.scheduler, list(self.wait_queue)))
        trace = self.trace
        if trace is not None:
            trace.before_batch(self)
        self._form_batch(now_us)
        formed_empty = not self.running
        if trace is not None:
            trace.formed(self)
        if self.stateful_latency:  # one EMA step per step, before this step's features
            self.preemption_ema = self.latency.update_preemption_ema(
                self.preemption_ema, self._preempted_count_step, len(self.running))
        d = self._execute(now_us)
        self.queue_depth_time_us += len(self.wait_queue) * d
        if self.tiered:  # after execution, before completions leave the batch (§3.8)
            self.kv.mirror(self.running)
        self._complete(now_us, d)
        if trace is not None:
            trace.stepped(self, now_us, d)
        self.stalled = formed_empty and self.waits_when_stalled and bool(self.wait_queue)
        if self.running or (self.wait_queue and not self.stalled):
            self.push(now_us + d, EV_STEP, None)
        else:
            self.step_pending = False

    def _form_batch(self, now_us: int) -> None:
        """vLLM-style FormBatch: phase 1 continues running requests, phase 2 admits new ones."""
        self._budget = self.max_batched_tokens
        self._preempted_this_step = False
        self._preempted_count_step = 0
        self._admitted_cached_tokens = {}
        running = self.running
        for r in running:
            r.num_new_tokens = 0
        mml = self.max_model_len
        i = 0
        while i < len(running):  # phase 1, re-reading the length: preemption shrinks it
            if self._budget <= 0:
                break
            r = running[i]
            if r.progress_index < r.input_tokens:  # prefill chunk
                n = self._clamp_prefill(r.input_tokens - r.progress_index, r.progress_index)
                ok, i = self._preempt_for_tokens(r, n, i)
                if not ok:
                    break
                self._budget -= n
                r.num_new_tokens = n
                r.computed_tokens += n
            elif r.output_tokens > 0:  # decode one token
                if mml > 0 and r.progress_index + 1 > mml - 1:
                    i += 1
                    continue
                ok, i = self._preempt_for_tokens(r, 1, i)
                if not ok:
                    break
                self._budget -= 1
                r.num_new_tokens = 1
                r.computed_tokens += 1
            i += 1
        # phase 2: admit from the head of the wait queue; never preempts, stops after a preemption
        while (len(running) < self.max_running and self.wait_queue and self._budget > 0
               and not self._preempted_this_step):
            head = self.wait_queue[0]
            if head.pd_part == PD_DECODE and head.progress_index >= head.input_tokens:
                # a decode sub-request holding its transferred KV: its first decode token
                l_in = head.input_tokens
                if not self.kv.allocate(head, l_in, l_in + 1):
                    break
                self._admit(head, now_us, 1, l_in + 1)
                continue
            cached = self.kv.cached_blocks(head)
            if self.reload_before_sizing:
                reloaded = self.kv.reload_prefix(head, len(cached), keep=cached)
                if reloaded:
                    cached = self.kv.cached_blocks(head)
            start = len(cached) * self.block_size
            n = self._clamp_prefill(head.input_tokens - start, start)
            if self.reload_before_sizing:
                ok = self.kv.allocate_reloaded(head, start, start + n, cached, reloaded)
            else:
                ok = self.kv.allocate(head, start, start + n, cached)
            if not ok:
                break  # the head blocks everything behind it
            self._admit(head, now_us, n, n + start)
            self._admitted_cached_tokens[head.index] = start
            self.recent.record(now_us, RecentSignals.HIT, start, head.input_tokens)

    def _admit(self, head, now_us: int, n: int, computed: int) -> None:
        """The wait queue's head joins the running batch with n new tokens."""
        self.wait_queue.popleft()
        self.running.append(head)
        head.state = Stage.RUNNING
        head.num_new_tokens = n
        self._budget -= n
        head.computed_tokens = computed
        head.scheduling_delay_us = now_us - head.arrival_us
        self.recent.record(now_us, RecentSignals.WAIT, now_us - head.arrival_us, 1)

    def _clamp_prefill(self, n: int, start: int) -> int:
        """Chunk size: long-prefill threshold, token budget, then the max-model-len cap."""
        thr = self.long_prefill_threshold
        if 0 < thr < n:
            n = thr
        n = min(n, self._budget)
        if self.max_model_len > 0:
            n = min(n, max(self.max_model_len - 1 - start, 0))
        return n

    def _preempt_for_tokens(self, req, n: int, cursor: int) -> tuple[bool, int]:
        """Allocate n tokens for a running request, evicting victims until it fits (§2.5).

        Returns (success, cursor) where the cursor is moved back for victims evicted before it.
        """
        while True:
            if self.kv.allocate(req, req.progress_index, req.progress_index + n):
                return True, cursor
            if not self.running:
                return False, cursor
            vi = self._victim_index()
            victim = self.running.pop(vi)
            if self.trace is not None:
                self.trace.preemption(self, victim, req)
            self._preempt(victim)
            if victim is req:
                return False, cursor
            if vi < cursor:
                cursor -= 1

    def _victim_index(self) -> int:
        if self.preemption_policy == PreemptionPolicy.FCFS:
            return len(self.running) - 1  # the most recently admitted request
        # "priority": least urgent (lowest score), latest arrival among equals; scan tail→head,
        # replacing only on strictly "more evictable".
        best = len(self.running) - 1
        r = self.running[best]
        best_key = (-r.priority, r.arrival_us)
        for j in range(len(self.running) - 2, -1, -1):
            r = self.running[j]
            key = (-r.priority, r.arrival_us)
            if key > best_key:
                best, best_key = j, key
        return best

    def _preempt(self, victim) -> None:
        self._preempted_this_step = True
        self._preempted_count_step += 1
        if victim.num_new_tokens > 0:
            self._budget += victim.num_new_tokens  # refund what it got earlier in this step
        victim.num_new_tokens = 0
        victim.state = Stage.QUEUED
        victim.progress_index = 0
        victim.itl_us = []
        victim.ttft_set = False
        self.kv.release(victim)
        victim.computed_tokens = 0
        victim.preemptions += 1
        self.preemption_count += 1
        self.wait_queue.appendleft(victim)

    def _execute(self, now_us: int) -> int:
        """Step duration from the scheduled requests, then progress, ITL and TTFT (§2.6)."""
        scheduled = [r for r in self.running if r.num_new_tokens > 0]
        batch = StepBatch(
            new_tokens=[r.num_new_tokens for r in scheduled],
            progress_index=[r.progress_index for r in scheduled],
            input_tokens=[r.input_tokens for r in scheduled],
            output_tokens=[r.output_tokens for r in scheduled],
        )
        # reloads of this step's batch formation add their transfer time (§3.8)
        transfer = self.kv.take_pending_latency_us() if self.tiered else 0
        if self.stateful_latency:
            cached = [self._admitted_cached_tokens.get(r.index, 0) for r in scheduled]
            inputs = self.latency.step_inputs(batch, self.preemption_ema,
                                              prefix_cached_tokens=cached)
            d = max(1, self.latency.step_time_us(inputs) + transfer)
        else:
            d = max(1, self.latency.step_time_us(batch) + transfer)
        if self.step_factor != 1.0:
            d = max(1, int(float(d) * self.step_factor))
        if self.observer is not None:
            self.observer.on_step(
                instance=self.index, time_us=now_us, duration_us=d, batch=batch,
                prefix_cached_tokens=[self._admitted_cached_tokens.get(r.index, 0)
                                      for r in scheduled],
                running_depth=len(self.running), waiting_depth=len(self.wait_queue),
                kv_used_blocks=self.kv.used_blocks, kv_total_blocks=self.kv.total_blocks,
                num_preempted=self._preempted_count_step, preemption_ema=self.preemption_ema)
        itl = d + self.otp_us
        for r in self.running:
            if r.progress_index < r.input_tokens:
                r.progress_index = r.computed_tokens
            elif r.num_new_tokens > 0:
                r.progress_index += 1
                r.itl_us.append(itl)
            if r.progress_index == r.input_tokens and not r.ttft_set:
                r.ttft_set = True
                r.ttft_us = now_us + d + self.otp_us - r.arrival_us
                self.recent.record(now_us, RecentSignals.TTFT, r.ttft_us, 1)
        used = self.kv.used_blocks
        self.peak_kv_blocks_used = max(self.peak_kv_blocks_used, used)
        self.kv_block_time_us += used * d
        self.kv_util_time_us[kv_util_bucket(used, self.kv.total_blocks)] += d
        self.busy_time_us += d
        return d

    def _complete(self, now_us: int, d: int) -> None:
        """Completion and length caps, accounted at the step start ``now_us`` (§2.7)."""
        remaining = []
        mml = self.max_model_len
        left_us = now_us + d
        for r in self.running:
            l_in, n_out, pi = r.input_tokens, r.output_tokens, r.progress_index
            finishing = records.output_finished(pi, l_in, n_out) or records.at_length_cap(pi, mml)
            if finishing:
                self.recent.record(now_us, RecentSignals.ITL, sum(r.itl_us), len(r.itl_us))
            if records.output_finished(pi, l_in, n_out):
                if n_out > 0 and pi < l_in + n_out and not self.kv.allocate(r, pi, pi + 1):
                    self.kv_allocation_failures += 1  # the final token's KV slot; BLIS
                    # counts the failure and completes the request all the same
                self._finish(r, left_us, capped=False)
            elif records.at_length_cap(pi, mml):
                self._finish(r, left_us, capped=True)
            else:
                remaining.append(r)
        self.running = remaining

    def _finish(self, r, left_us: int, capped: bool) -> None:
        self.kv.release(r)
        r.state = Stage.COMPLETED
        r.length_capped = capped
        if capped:
            self.length_capped += 1
        r.output_tokens_done = records.output_tokens_done(r.progress_index, r.input_tokens,
                                                          r.output_tokens)
        # a decode sub-request that never re-prefilled has no first-token time (0, as BLIS)
        ttft = r.ttft_us if r.ttft_set else 0
        r.e2e_us = records.e2e_us(ttft, sum(r.itl_us), r.output_tokens, self.post_decode_us)
        r.left_us = left_us
        self.itl_entries.extend(r.itl_us)
        self.itl_entry_rows.extend([r.index] * len(r.itl_us))
        self.completed += 1
        self.finished.append(r)
        if left_us <= self.horizon_us:
            self.last_left_us = max(self.last_left_us, left_us)

    # ---- end of run ----------------------------------------------------------------------------
    def sim_ended_us(self) -> int:
        """min(time of the last executed event, horizon); RequestLeft events count as events."""
        return min(max(self.clock_us, self.last_left_us), self.horizon_us)
