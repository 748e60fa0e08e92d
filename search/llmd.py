"""The routing of a policy as an llm-d ``EndpointPickerConfig`` (``endpoint_picker.yaml``).

llm-d's router (the endpoint picker, EPP, of the Gateway API Inference Extension) routes each
request by running a *scheduling profile*: scorer plugins give every candidate endpoint a score
in [0, 1], the profile adds ``weight × score`` over its scorers, and the ``max-score-picker``
takes the highest total (ties at random). blisjax's ``weighted`` routing policy is the same
machine: normalized weights times scores clamped to [0, 1], argmax, random ties. So a searched
weighted policy carries over as one profile whose scorers are the llm-d plugins that compute the
same score as blisjax's scorers.

Scorer mapping (blisjax label → llm-d plugin type), only where the formulas agree:

* ``prefix-affinity`` → ``prefix-cache-scorer``: matched leading prompt blocks divided by the
  request's full blocks, looked up in a router-side index fed by past routing decisions (neither
  side learns about real evictions). Block size and index capacity are llm-d parameters left at
  their defaults; set them to the engine's block size when deploying.
* ``precise-prefix-cache`` → ``precise-prefix-cache-scorer``: the number of leading prompt
  blocks present in each instance's *real* KV cache (llm-d learns it from vLLM's KV events),
  min-max normalized, every endpoint 1 when all counts are equal. llm-d normalizes over the
  endpoints that hold at least one block and gives the others 0, blisjax over every instance:
  the two agree when every instance holds a block, or when all instances that hold any hold
  equally many (and both are uniform when none does). The plugin needs the
  deployment's tokenizer and KV-event settings, which a simulation cannot supply.
* ``queue-depth`` → ``queue-scorer``: ``(max − waiting)/(max − min)`` over the waiting queues,
  1 when all are equal.
* ``kv-utilization`` → ``kv-cache-utilization-scorer``: ``1 − KV utilization``.
* ``load-aware`` → ``load-aware-scorer`` with ``threshold: 128``: 0.5 for an empty waiting
  queue, else ``0.5·(1 − min(waiting, 128)/128)``.
* ``active-requests`` → ``active-request-scorer``: ``(max − count)/max`` over the requests
  dispatched and not finished, 1 for an idle endpoint.
* ``running-requests`` → ``running-requests-size-scorer``: min-max of the running batch size,
  fewer running scoring higher, 1 when all are equal.
* ``no-hit-lru`` → ``no-hit-lru-scorer``: 0.5 everywhere for a request with a prefix-cache hit
  somewhere; for a cold request a ramp from 1 (never or least recently sent a cold request) down
  to 0 (most recently). blisjax decides warm or cold from the instances' own caches; point the
  llm-d plugin at the precise prefix plugin to do the same.
* ``load-balance`` — no llm-d scorer computes ``1/(1 + waiting + running + in flight)``.
* ``vllm-dp`` — no llm-d scorer computes vLLM's data-parallel load ``4·waiting + running``.

A scorer without an llm-d plugin cannot be written: the exported profile would route
differently from the searched policy. ``endpoint_picker_config`` then lists it in
``EndpointPickerExport.left_out``, and its callers refuse to write the file unless asked for an
approximation (``blisjax export-llmd --allow-approximation``); ``search`` writes the
approximation and simulates it, so its score stands beside the searched policy's in
``summary.json``. ``EndpointPickerExport.knobs`` is the approximation as routing knobs (the
left-out scorers at weight 0, the others at the weights written), which is how it is simulated:
a scorer at weight 0 adds exactly nothing to the weighted sum. The file itself names each
left-out scorer and its weight in a comment. Zero weights are left out too (they add nothing), and a scorer listed twice becomes one
plugin with the sum of its weights (the same weighted sum).

Weights. blisjax divides the weights by their sum; llm-d adds ``weight × score`` as written.
Both pick the same endpoint (the ranking is invariant under a common positive factor, up to
floating-point rounding), so the searched weights are written as they are. The
``inference.networking.x-k8s.io/v1alpha1`` apiVersion also names early releases whose weight
field is an integer (a fraction fails to load), so for it every weight is written as the integer
``round_half_even(1000 · w / Σw)`` (Σw over all of the policy's scorers, computed exactly with
rationals), the exact weights kept in a comment.

Policies without weights have no llm-d counterpart and get no file: llm-d's pickers are
max-score, random and weighted-random (no rotation, so no ``round-robin``); no llm-d scorer
computes blisjax's effective load ``waiting + running + in flight`` (``least-loaded``); and
``always-busiest`` deliberately routes badly.

Schema (field names, apiVersion values, weight type and plugin type names), read from the
public sources: the ``EndpointPickerConfig`` Go types in ``apix/config/v1alpha1`` of
github.com/kubernetes-sigs/gateway-api-inference-extension and github.com/llm-d/llm-d-router
(``plugins[].name/type/parameters``, ``schedulingProfiles[].name/plugins[].pluginRef/weight``;
weight ``*int`` in early releases, ``*float64`` later), the config loader of llm-d-router
(``pkg/epp/config/loader``: ``llm-d.ai/v1alpha1`` current, the x-k8s.io group still accepted
and logged as deprecated), the scorer sources under
``pkg/epp/framework/plugins/scheduling/scorer/`` there, and the architecture document of
github.com/llm-d/llm-d-inference-scheduler (``docs/architecture.md``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from fractions import Fraction
from typing import NamedTuple

from blisjax.config import ConfigError, SimConfig

__all__ = ["API_VERSIONS", "DEFAULT_API_VERSION", "ENDPOINT_PICKER", "INTEGER_WEIGHT_TOTAL",
           "LEGACY_API_VERSION", "SCORER_PLUGINS", "EndpointPickerExport", "PluginMatch",
           "check_api_version", "endpoint_picker_config"]

#: File name of the export, next to ``best_policy.yaml``.
ENDPOINT_PICKER = "endpoint_picker.yaml"
#: apiVersion of current llm-d routers (llm-d-router).
DEFAULT_API_VERSION = "llm-d.ai/v1alpha1"
#: apiVersion of the Gateway API Inference Extension's EPP and of earlier llm-d schedulers
#: (still read, as deprecated, by current llm-d routers).
LEGACY_API_VERSION = "inference.networking.x-k8s.io/v1alpha1"
API_VERSIONS = (DEFAULT_API_VERSION, LEGACY_API_VERSION)
#: With integer weights, the written weights add up to about this (one part in a thousand).
INTEGER_WEIGHT_TOTAL = 1000

PROFILE_HANDLER = "single-profile-handler"
PICKER = "max-score-picker"


class PluginMatch(NamedTuple):
    """The llm-d counterpart of one blisjax scorer.

    plugin_type: llm-d plugin ``type``; None when llm-d has no plugin with the same formula.
    parameters: plugin parameters that pin the formula to blisjax's, as (name, value) pairs.
    note: for a missing plugin, what the blisjax scorer computes (written into the file).
    """

    plugin_type: str | None
    parameters: tuple[tuple[str, int], ...] = ()
    note: str = ""


#: blisjax scorer label → llm-d plugin (see the module docstring for why each pair agrees).
SCORER_PLUGINS: dict[str, PluginMatch] = {
    "prefix-affinity": PluginMatch("prefix-cache-scorer"),
    "queue-depth": PluginMatch("queue-scorer"),
    "kv-utilization": PluginMatch("kv-cache-utilization-scorer"),
    "load-balance": PluginMatch(None, note="1/(1 + waiting + running + in-flight requests)"),
    "precise-prefix-cache": PluginMatch("precise-prefix-cache-scorer"),
    "load-aware": PluginMatch("load-aware-scorer", (("threshold", 128),)),
    "active-requests": PluginMatch("active-request-scorer"),
    "running-requests": PluginMatch("running-requests-size-scorer"),
    "no-hit-lru": PluginMatch("no-hit-lru-scorer"),
    "vllm-dp": PluginMatch(None, note="vLLM's data-parallel load, inverted min-max of "
                                      "4 x waiting + running"),
}

#: Why a routing policy without weights gets no EndpointPickerConfig.
_UNWEIGHTED_REASONS = {
    "round-robin": "llm-d has no rotating picker (its pickers are max-score, random and "
                   "weighted-random)",
    "least-loaded": "no llm-d scorer computes the effective load waiting + running + in-flight "
                    "requests",
    "always-busiest": "it routes to the busiest instance on purpose; llm-d offers no such "
                      "scorer",
    "program": "a policy program is an expression, not a weighted sum of llm-d's scorers",
}

#: Plugins whose llm-d parameters depend on the deployment, with what to set.
_DEPLOYMENT_NOTES = {
    "prefix-cache-scorer": "set its block size to the engine's KV block size",
    "precise-prefix-cache-scorer": "needs the deployment's tokenizer and KV-event parameters "
                                   "(tokenProcessorConfig, indexerConfig, kvEventsConfig)",
    "no-hit-lru-scorer": "blisjax tells warm from cold requests by the instances' own KV "
                         "caches: point it at the precise prefix plugin if one is used",
}


class EndpointPickerExport(NamedTuple):
    """An EndpointPickerConfig, or why there is none.

    text: the YAML text (comments included), or None when the policy has no llm-d counterpart.
    reason: why ``text`` is None; "" otherwise.
    left_out: one line per scorer with a nonzero weight that the file cannot carry (no llm-d
      plugin, or an integer weight that rounds to 0); empty when the file routes exactly as the
      policy does. A non-empty ``left_out`` makes ``text`` an approximation.
    knobs: the policy llm-d runs from ``text``, as ``routing.scorers.<name>`` knobs
      (``blisjax.engine.population.set_knob``): every scorer at the weight written, a left-out
      one at 0. Empty when ``text`` is None.
    """

    text: str | None
    reason: str = ""
    left_out: tuple[str, ...] = ()
    knobs: dict[str, float] = {}  # noqa: RUF012 (never mutated; NamedTuple default)

    @property
    def exact(self) -> bool:
        """Whether the file routes exactly as the policy does."""
        return self.text is not None and not self.left_out

    def refusal(self) -> str:
        """Why the file is not written without an approximation being asked for."""
        return ("the llm-d EndpointPickerConfig would route differently from the policy: "
                + "; ".join(self.left_out))


def check_api_version(value: str, flag: str = "--llmd-api-version") -> str:
    """``value`` if it is a known EndpointPickerConfig apiVersion, else ConfigError naming
    ``flag`` and the allowed values."""
    if value not in API_VERSIONS:
        raise ConfigError(flag, f"must be one of {', '.join(API_VERSIONS)}, got {value!r}")
    return value


def _yaml_float(value: float) -> str:
    """``repr`` of a finite float in a form every YAML reader takes as a float (YAML 1.1
    readers need a dot before an exponent: ``1e-05`` → ``1.0e-05``)."""
    text = repr(float(value))
    if "e" in text and "." not in text:
        mantissa, _, exponent = text.partition("e")
        text = f"{mantissa}.0e{exponent}"
    return text


def _integer_weights(weights: Sequence[float]) -> list[int]:
    """``round_half_even(INTEGER_WEIGHT_TOTAL · w / Σw)`` per weight, with exact rationals."""
    total = sum(Fraction(w) for w in weights)
    return [round(Fraction(w) * INTEGER_WEIGHT_TOTAL / total) for w in weights]


def _comment(text: str, indent: str = "") -> list[str]:
    """``text`` as YAML comment lines of at most 100 characters."""
    return [f"# {indent}{line}" for line in textwrap.wrap(
        text, 98 - len(indent), break_on_hyphens=False, break_long_words=False)]


def endpoint_picker_config(config: SimConfig, api_version: str = DEFAULT_API_VERSION,
                           header: Sequence[str] = ()) -> EndpointPickerExport:
    """The routing policy of ``config`` as an llm-d EndpointPickerConfig.

    Args:
      config: the experiment whose ``policy.routing`` is exported.
      api_version: one of :data:`API_VERSIONS`; :data:`LEGACY_API_VERSION` writes integer
        weights (see the module docstring).
      header: comment lines written first (without ``#``).

    Returns:
      The YAML text, or None and the reason when the policy has no llm-d counterpart (a routing
      policy without weights, or no weighted scorer with an llm-d plugin).

    Raises:
      ConfigError: ``api_version`` is not a known apiVersion.
    """
    check_api_version(api_version)
    routing = config.policy.routing
    if routing.policy != "weighted":
        reason = _UNWEIGHTED_REASONS.get(routing.policy, "it has no scorer weights")
        return EndpointPickerExport(None, f"routing policy {routing.policy!r} has no llm-d "
                                          f"EndpointPickerConfig: {reason}")
    scorers = list(routing.scorers)
    integer = api_version == LEGACY_API_VERSION
    written = _integer_weights([s.weight for s in scorers]) if integer \
        else [s.weight for s in scorers]
    # plugin type -> (labels, summed weight, match), in first-appearance order; a scorer listed
    # twice adds its weights, which is what a sum of weight x score does.
    kept: dict[str, tuple[list[str], float | int, PluginMatch]] = {}
    knobs: dict[str, float] = {}  # the routing llm-d runs, as knobs
    left_out: list[str] = []  # scorers with weight whose absence changes the routing
    zero: list[str] = []  # scorers with weight 0
    for scorer, weight in zip(scorers, written, strict=True):
        match = SCORER_PLUGINS.get(scorer.name, PluginMatch(None, note="unknown scorer"))
        exact = _yaml_float(scorer.weight)
        knob = f"routing.scorers.{scorer.name}"  # a scorer listed twice: one summed knob
        written_weight = 0.0 if match.plugin_type is None or scorer.weight == 0 else weight
        knobs[knob] = knobs.get(knob, 0.0) + float(written_weight)
        if match.plugin_type is None:
            if scorer.weight != 0:
                left_out.append(f"{scorer.name} (weight {exact}): no llm-d equivalent; it "
                                f"scores {match.note}")
            else:
                zero.append(scorer.name)
        elif scorer.weight == 0:
            zero.append(scorer.name)
        elif weight == 0:
            left_out.append(f"{scorer.name} (weight {exact}): its integer weight rounds to 0")
        elif match.plugin_type in kept:
            labels, total, _ = kept[match.plugin_type]
            kept[match.plugin_type] = ([*labels, scorer.name], total + weight, match)
        else:
            kept[match.plugin_type] = ([scorer.name], weight, match)
    if not kept:
        return EndpointPickerExport(None, "no scorer of the policy with a nonzero weight has an "
                                          "llm-d plugin: " + "; ".join(left_out))
    lines = [f"# {h}" for h in header]
    lines.append(f"# llm-d EndpointPickerConfig of this policy's weighted routing "
                 f"({len(kept)} of {len(scorers)} scorers).")
    if left_out:
        lines.append("# Left out, so llm-d routes differently from the searched policy:")
        for item in left_out:
            lines += _comment(item, "  ")
    if zero:
        lines += _comment(f"Left out with weight 0 (they add nothing): {', '.join(zero)}")
    if integer:
        exact = ", ".join(f"{s.name}={_yaml_float(s.weight)}" for s in scorers)
        lines += _comment(f"Weights are integers for {api_version}: round-half-even of "
                          f"{INTEGER_WEIGHT_TOTAL} x weight / sum of weights. Exact weights: "
                          f"{exact}.")
    else:
        lines += _comment("Weights as searched; blisjax divides them by their sum, llm-d does "
                          "not, which leaves the ranking of endpoints the same.")
    lines += [f"apiVersion: {api_version}", "kind: EndpointPickerConfig", "plugins:",
              f"- type: {PROFILE_HANDLER}"]
    for labels, _, match in kept.values():
        note = _DEPLOYMENT_NOTES.get(match.plugin_type or "")
        if note:
            lines += _comment(f"{match.plugin_type}: {note}")
        lines.append(f"- type: {match.plugin_type}  # blisjax {' + '.join(labels)}")
        if match.parameters:
            lines.append("  parameters:")
            lines.extend(f"    {name}: {value}" for name, value in match.parameters)
    lines += [f"- type: {PICKER}", "schedulingProfiles:", "- name: default", "  plugins:"]
    for _, weight, match in kept.values():
        text = str(weight) if integer else _yaml_float(weight)
        lines += [f"  - pluginRef: {match.plugin_type}", f"    weight: {text}"]
    lines.append(f"  - pluginRef: {PICKER}")
    return EndpointPickerExport("\n".join(lines) + "\n", left_out=tuple(left_out),
                                knobs=knobs)

