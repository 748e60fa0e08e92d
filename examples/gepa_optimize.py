"""GEPA evolves the policy of the prefix-affinity scenario with an LLM reading decision traces.

The scenario (``configs/search/prefix-affinity.yaml``) routes by load only and misses its
100 ms TTFT target for most requests; the policy that wins pins each tenant to one instance
(prefix-affinity weight at least the load-balance weight, which stays > 0). GEPA starts from
the configured policy; each iteration its reflection LM reads one policy section, the metrics
it reached on the training seeds and the decision-trace summary of those runs, and proposes a
new section, which is kept when it scores better (``search.adapters.gepa_adapter``).

    # a real LLM through litellm (pip install litellm); the provider's usual key variable
    export BLISJAX_LLM_MODEL=openai/gpt-4.1-mini OPENAI_API_KEY=...
    python examples/gepa_optimize.py --max-metric-calls 60

    # no LLM: a scripted reflection LM that proposes prefix-affinity routing
    python examples/gepa_optimize.py --offline

It prints the seed's and the best candidate's mean validation score (SLO attainment, in [0, 1])
and the best candidate's sections. ``--engine reference`` (the default) simulates one candidate
at a time (~0.4 s a run here); ``--engine auto`` runs candidates as lanes of the JAX engine,
which pays a compile per workload seed and wins when GEPA scores many candidates at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "search" / "prefix-affinity.yaml"
#: The routing the offline reflection LM proposes: affinity well above load, load still > 0.
AFFINITY_ROUTING = """routing:
  policy: weighted
  scorers:
  - name: prefix-affinity
    weight: 4.0
  - name: load-balance
    weight: 1.0
  tie_break: lowest-index
"""


class ScriptedReflectionLM:
    """A reflection LM without a model, for running the example anywhere: it reads which
    section GEPA asks about (the first ``` block of the prompt) and proposes
    ``AFFINITY_ROUTING`` for routing, the section unchanged otherwise."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, prompt: str | list[dict[str, str]]) -> str:
        self.calls += 1
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        current = text.split("```\n", 1)[1].split("\n```", 1)[0]
        name = current.split(":", 1)[0].strip()
        proposal = AFFINITY_ROUTING if name == "routing" else current + "\n"
        return f"```yaml\n{proposal}```"


class Outcome(NamedTuple):
    """What the example reports: the mean validation scores of the seed candidate and the best
    one, the best candidate, and how many candidates GEPA kept."""

    seed_score: float
    best_score: float
    best_candidate: dict[str, str]
    candidates: int


class _Quiet:
    """GEPA's logger protocol, silenced (the example prints its own summary)."""

    def log(self, message: str) -> None:
        pass


def _seeds(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--offline", action="store_true",
                        help="use the scripted reflection LM instead of $BLISJAX_LLM_MODEL")
    parser.add_argument("--config", default=str(CONFIG), help="experiment YAML")
    parser.add_argument("--train-seeds", type=_seeds, default=[1, 2])
    parser.add_argument("--val-seeds", type=_seeds, default=[101, 102, 103])
    parser.add_argument("--objective", default="slo_attainment")
    parser.add_argument("--engine", default="reference", choices=("auto", "jax", "reference"))
    parser.add_argument("--max-metric-calls", type=int, default=40,
                        help="GEPA's budget: (candidate, case) simulations")
    parser.add_argument("--seed", type=int, default=0, help="GEPA's random seed")
    parser.add_argument("--run-dir", default=None, help="GEPA's state directory (resumable)")
    parser.add_argument("--verbose", action="store_true", help="print GEPA's log")
    return parser.parse_args(argv)


def reflection_lm(offline: bool):
    """The scripted LM offline, else the litellm model string of ``$BLISJAX_LLM_MODEL``."""
    if offline:
        return ScriptedReflectionLM()
    model = os.environ.get("BLISJAX_LLM_MODEL")
    if not model:
        sys.exit("set BLISJAX_LLM_MODEL to a litellm model (e.g. openai/gpt-4.1-mini) and the "
                 "provider's key variable, or pass --offline")
    return model


def optimize(args: argparse.Namespace) -> Outcome:
    """Run GEPA with the arguments of ``parse_args``."""
    import gepa

    from search.adapters.core import seed_candidate
    from search.adapters.gepa_adapter import REFLECTION_PROMPT, BlisjaxGEPAAdapter, load_cases

    train = load_cases([args.config], args.train_seeds)
    val = load_cases([args.config], args.val_seeds)
    adapter = BlisjaxGEPAAdapter(objective=args.objective, engine=args.engine)
    result = gepa.optimize(
        seed_candidate=seed_candidate(train[0].config), trainset=train, valset=val,
        adapter=adapter, reflection_lm=reflection_lm(args.offline),
        reflection_prompt_template=REFLECTION_PROMPT,
        reflection_minibatch_size=len(train), max_metric_calls=args.max_metric_calls,
        seed=args.seed, run_dir=args.run_dir, logger=None if args.verbose else _Quiet())
    best = result.best_idx
    return Outcome(result.val_aggregate_scores[0], result.val_aggregate_scores[best],
                   dict(result.candidates[best]), len(result.candidates))


def main(argv: list[str] | None = None) -> Outcome:
    args = parse_args(argv)
    outcome = optimize(args)
    print(f"{args.objective}: seed policy {outcome.seed_score:.4g}, best of "
          f"{outcome.candidates} candidates {outcome.best_score:.4g}")
    for name, text in outcome.best_candidate.items():
        print(f"--- {name}\n{text.rstrip()}")
    return outcome


if __name__ == "__main__":
    main()
