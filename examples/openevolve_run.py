"""Evolve a blisjax policy with OpenEvolve, blisjax simulating every candidate.

Against a real LLM (any OpenAI-compatible endpoint)::

    export OPENEVOLVE_API_BASE=http://localhost:8000/v1 OPENEVOLVE_MODEL=my-model
    export OPENEVOLVE_API_KEY=...
    python examples/openevolve_run.py --kind code --iterations 20 --out results/openevolve

Offline (a scripted client stands in for the LLM: it proposes prefix-aware routing once, so
the run shows the loop end to end in seconds, without an endpoint)::

    python examples/openevolve_run.py --offline --iterations 3

The evolved program starts from ``examples/openevolve/initial_code_policy.py`` (``--kind
code``: least-load ``route_scores``) or ``initial_bundle_program.py`` (``--kind bundle``: the
scenario's configured policy bundle); the evaluator is ``search/adapters/openevolve_evaluator.py``,
configured here through its environment variables. Run from the repository root.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Any

import yaml

import search.adapters.openevolve_evaluator as evaluator
from search.adapters.openevolve_evaluator import ScriptRule, configure, scripted_client

HERE = Path(__file__).resolve().parent
INITIAL = {"code": HERE / "openevolve" / "initial_code_policy.py",
           "bundle": HERE / "openevolve" / "initial_bundle_program.py"}
#: The offline client's one idea per kind: weigh the prefix cache well above the load.
OFFLINE_RULES = {
    "code": (ScriptRule(
        when="return [-float(i.queue_depth + i.batch_size + i.in_flight) for i in instances]",
        reply="""Requests of a tenant share a 1,024-token prefix: routing them where it is cached
skips a long prefill. Prefer cached blocks, and break ties by load.

<<<<<<< SEARCH
    return [-float(i.queue_depth + i.batch_size + i.in_flight) for i in instances]
=======
    return [8.0 * i.cached_blocks - float(i.queue_depth + i.batch_size + i.in_flight)
            for i in instances]
>>>>>>> REPLACE
"""),),
    "bundle": (ScriptRule(
        when='{"name": "prefix-affinity", "weight": 0.0}',
        reply="""Weigh prefix affinity well above load so each tenant stays where its prefix is.

<<<<<<< SEARCH
                {"name": "prefix-affinity", "weight": 0.0},
=======
                {"name": "prefix-affinity", "weight": 10.0},
>>>>>>> REPLACE
"""),),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", choices=sorted(INITIAL), default="code",
                   help="the initial program: a code policy or a policy bundle")
    p.add_argument("--experiment", default="configs/search/prefix-affinity.yaml",
                   help="the blisjax experiment the policy is evolved for")
    p.add_argument("--seeds", default="1,2", help="workload seeds scored (comma-separated)")
    p.add_argument("--holdout-seeds", default="101,102",
                   help="held-out seeds, reported but not scored")
    p.add_argument("--iterations", type=int, default=None,
                   help="evolution iterations (default: the config's max_iterations)")
    p.add_argument("--config", default=str(HERE / "openevolve" / "config.yaml"),
                   help="OpenEvolve configuration")
    p.add_argument("--out", default="results/openevolve", help="output directory")
    p.add_argument("--offline", action="store_true",
                   help="use the scripted client instead of an LLM endpoint")
    return p.parse_args(argv)


def openevolve_config(path: str, kind: str, offline: bool) -> Any:
    """OpenEvolve's ``Config`` from ``path``, its LLM endpoint from the environment (or the
    scripted client when ``offline``)."""
    from openevolve.config import Config, LLMModelConfig

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    llm = data.setdefault("llm", {})
    if offline:  # no endpoint and no key: the scripted client replaces the models below
        llm["api_key"] = "offline"
    else:
        llm["api_base"] = os.environ.get("OPENEVOLVE_API_BASE", llm.get("api_base"))
        if os.environ.get("OPENEVOLVE_MODEL"):
            llm["models"] = [{"name": os.environ["OPENEVOLVE_MODEL"], "weight": 1.0}]
    config = Config.from_dict(data)
    if offline:
        client = functools.partial(scripted_client, OFFLINE_RULES[kind])
        config.llm.models = [LLMModelConfig(name="scripted", init_client=client)]
        config.llm.evaluator_models = []
    return config


def main(argv: list[str] | None = None) -> int:
    from openevolve.api import run_evolution

    args = parse_args(argv)
    configure(args.experiment, reset=True, kind=args.kind,
              seeds=[int(s) for s in args.seeds.split(",") if s],
              holdout_seeds=[int(s) for s in args.holdout_seeds.split(",") if s])
    config = openevolve_config(args.config, args.kind, args.offline)
    result = run_evolution(initial_program=str(INITIAL[args.kind]),
                           evaluator=evaluator.__file__, config=config,
                           iterations=args.iterations, output_dir=args.out, cleanup=False)
    print(f"best combined_score {result.best_score:.4f}; metrics {result.metrics}")
    print(result.best_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
