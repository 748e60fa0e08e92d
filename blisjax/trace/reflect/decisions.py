"""One routing decision judged and put in words: how long its request waited, which targets
it missed (``_badness``), how decisions rank (``_worst_key``), the alternative it is compared
with, and the phrases that describe the request, a candidate and the request's outcome.
"""

from __future__ import annotations

from collections.abc import Callable

from blisjax.trace.reflect.focus import _slo_targets
from blisjax.trace.reflect.formats import _at, _class_name, _dur, _num, _pct
from blisjax.trace.reflect.runview import Decision, Fate, RunView, View

#: A request "waited long" when its routing → first batch time exceeds its SLO class's TTFT
#: target, or this (µs) when its class has none.
LONG_WAIT_US = 1_000_000

# ---- judging ------------------------------------------------------------------------------------


def _wait_us(rv: RunView, d: Decision) -> int:
    """Routing → the request's first batch, µs (-1 if it never got one)."""
    fate = rv.fates.get(d.request_id)
    return -1 if fate is None or fate.first_batch_us < 0 else fate.first_batch_us - d.time_us


def _limits_us(rv: RunView, d: Decision) -> tuple[int, int]:
    """(first-token, E2E) limits of the decision's request, µs: its SLO class's TTFT and E2E
    targets; ``LONG_WAIT_US`` and none (0) for a class without them."""
    t = _slo_targets(rv.config).get(_class_name(d.slo_class))
    ttft = float(getattr(t, "ttft_ms", 0.0)) if t is not None else 0.0
    e2e = float(getattr(t, "e2e_ms", 0.0)) if t is not None else 0.0
    return (int(ttft * 1000) if ttft > 0 else LONG_WAIT_US, int(e2e * 1000))


def _badness(rv: RunView, d: Decision) -> tuple[int, int, float, int, int]:
    """Larger = worse outcome: (never completed, targets missed, worst time / limit, first-token
    time, E2E). The first-token time is the TTFT (rows) or else the wait from routing to the
    first batch, the E2E the rows' or else routing → the end of the last step (µs; without rows
    both are lower bounds: the latency model's per-token overheads come on top). A target
    missed is a limit of ``_limits_us`` exceeded, or a preemption."""
    fate = rv.fates.get(d.request_id)
    if fate is None:
        return (1, 1, 0.0, 0, 0)
    first = fate.ttft_us if fate.ttft_us >= 0 else _wait_us(rv, d)
    e2e = fate.e2e_us if fate.e2e_us >= 0 else (fate.done_us - d.time_us
                                                if fate.done_us >= 0 else 0)
    unfinished = int(fate.done_us < 0 and fate.e2e_us < 0)
    first_limit, e2e_limit = _limits_us(rv, d)
    missed = (int(first < 0 or first > first_limit) + int(0 < e2e_limit < e2e)
              + int(fate.preemptions > 0))
    ratio = max(first / first_limit, e2e / e2e_limit if e2e_limit > 0 else 0.0)
    return (unfinished, missed, ratio, first, e2e)


def _notable(rv: RunView, d: Decision) -> bool:
    """A decision worth showing: regret > 0, or its request missed a target (``_badness``)."""
    bad = _badness(rv, d)
    return d.regret > 0 or bad[0] > 0 or bad[1] > 0


def _worst_key(rv: RunView) -> Callable[[Decision], tuple]:
    """Rank decisions: highest regret first, then worst outcome, then time and request id."""
    def key(d: Decision) -> tuple:
        bad = _badness(rv, d)
        return (-d.regret, *(-b for b in bad), d.time_us, d.request_id, d.prefill)
    return key


def _worst(rv: RunView, n: int, exclude: frozenset[int] = frozenset()) -> list[Decision]:
    """Up to ``n`` notable decisions (``_notable``), worst first (``_worst_key``)."""
    pool = [d for d in rv.decisions if d.index not in exclude and _notable(rv, d)]
    return sorted(pool, key=_worst_key(rv))[:n]


def _alternative(d: Decision) -> View | None:
    """The instance the decision is compared with: the top counterfactual candidate when it is
    strictly better (regret > 0), else the least-loaded other candidate if less loaded, else
    the one with the most of the prompt cached if more (None: no better alternative)."""
    if d.regret > 0 and d.best >= 0:  # with no regret, the "best" only won a tie
        return d.view(d.best)
    chosen = d.view(d.chosen)
    others = [v for v in d.views if v.instance != d.chosen]
    if chosen is None or not others:
        return None
    light = min(others, key=lambda v: (v.load, v.instance))
    if light.load < chosen.load:
        return light
    cached = max(others, key=lambda v: (v.cached_blocks, -v.instance))
    return cached if cached.cached_blocks > chosen.cached_blocks else None


def _regret_rule(d: Decision) -> str:
    """What regret measures under the decision's policy."""
    if d.views and d.views[0].score is not None:
        return "regret = best − chosen policy score"
    return "regret = chosen load − least load, load = q + b + f"


# ---- phrasing -----------------------------------------------------------------------------------


def _request_phrase(d: Decision) -> str:
    group = f", prefix group {d.prefix_group}" if d.prefix_group >= 0 else ""
    return (f"request {d.request_id} ({_class_name(d.slo_class)}, {d.input_tokens} prompt "
            f"tokens{group})")


def _view_phrase(v: View) -> str:
    score = f", score {_num(v.score)}" if v.score is not None else ""
    return f"inst {v.instance} (load {v.load}, {v.cached_blocks} blocks cached{score})"


def _view_row(v: View, mark: str) -> str:
    score = "" if v.score is None else f", s {_num(v.score)}"
    return (f"     inst {v.instance}: q {v.queue_depth}, b {v.batch_size}, f {v.in_flight}, "
            f"kv {_pct(v.kv_utilization)}, c {v.cached_blocks}{score}{mark}")


def _fate_extras(fate: Fate) -> list[str]:
    """The outcome phrases' common tail: preemptions, and TTFT and E2E when known."""
    parts = []
    if fate.preemptions:
        parts.append(f"preempted {fate.preemptions}×")
    if fate.ttft_us >= 0:
        parts.append(f"TTFT {_dur(fate.ttft_us)}")
    if fate.e2e_us >= 0:
        parts.append(f"E2E {_dur(fate.e2e_us)}")
    return parts


def _outcome_phrase(rv: RunView, d: Decision) -> str:
    """What became of the decision's request."""
    fate = rv.fates.get(d.request_id)
    if fate is None:
        return "no batch ever took it"
    parts = []
    if fate.first_batch_us >= 0:
        where = f" on inst {fate.first_instance}" if fate.first_instance != d.chosen else ""
        parts.append(f"scheduled {_dur(fate.first_batch_us - d.time_us)} after routing{where}")
    else:
        parts.append("never scheduled")
    if fate.done_us >= 0:
        parts.append(f"last step ended {_dur(fate.done_us - d.time_us)} after routing (at "
                     f"{_at(fate.done_us)})")
    else:
        parts.append("not completed" + (f" ({fate.status})" if fate.status else ""))
    parts += _fate_extras(fate)
    return "; ".join(parts)


def _outcome_short(rv: RunView, d: Decision) -> str:
    """``_outcome_phrase`` in few tokens (times after routing)."""
    fate = rv.fates.get(d.request_id)
    if fate is None:
        return "never scheduled"
    parts = [f"scheduled +{_dur(fate.first_batch_us - d.time_us)}" if fate.first_batch_us >= 0
             else "never scheduled"]
    parts.append(f"last step +{_dur(fate.done_us - d.time_us)}" if fate.done_us >= 0
                 else "not completed" + (f" ({fate.status})" if fate.status else ""))
    parts += _fate_extras(fate)
    return ", ".join(parts)
