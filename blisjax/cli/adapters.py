"""`gepa-evaluate` and `openevolve-evaluate`: score a candidate as the search adapters do."""

from __future__ import annotations

import json
import sys
from typing import Any

from blisjax.cli.common import default_config_path
from blisjax.cli.files import check_text_file
from blisjax.config import ConfigError, load_config


def _adapter_seeds(args: Any, config_path: str) -> tuple[int, ...]:
    from search.api import parse_seed_list

    if args.seeds is not None:
        return parse_seed_list("--seeds", args.seeds)
    return (load_config(config_path).seed,)


def cmd_gepa_evaluate(args: Any) -> int:
    """The GEPA adapter's score and feedback for one policy bundle (``search.adapters.gepa_adapter``);
    JSON on stdout, the feedback text also on stderr."""
    from search.adapters.gepa_adapter import gepa_evaluate

    check_text_file("--policy-config", args.policy_config)
    configs = args.config or [str(default_config_path())]
    for path in configs:
        check_text_file("--config", path)
    report = gepa_evaluate(args.policy_config, configs, _adapter_seeds(args, configs[0]),
                           args.objective, args.engine,
                           feedback_strategy=args.feedback_strategy)
    if not args.quiet:
        print(report.feedback, end="", file=sys.stderr)
    print(json.dumps({"cases": list(report.cases), "scores": list(report.scores),
                      "engines": list(report.engines), "errors": list(report.errors),
                      "mean_score": report.mean_score, "feedback_case": report.feedback_case,
                      "feedback": report.feedback}, indent=2, ensure_ascii=False))
    return 0


def cmd_openevolve_evaluate(args: Any) -> int:
    """The OpenEvolve evaluator's metrics and summary for one candidate file, a programs file
    or Python (``search.adapters.openevolve_evaluator``); JSON on stdout, the summary also on
    stderr."""
    from search.adapters.openevolve_evaluator import openevolve_evaluate
    from search.api import parse_seed_list

    check_text_file("PROGRAM", args.program)
    check_text_file("--config", args.config)
    if not args.time_limit > 0:
        raise ConfigError("--time-limit", f"must be > 0 seconds, got {args.time_limit}")
    holdout = (parse_seed_list("--holdout-seeds", args.holdout_seeds)
               if args.holdout_seeds else ())
    report = openevolve_evaluate(args.program, args.config, _adapter_seeds(args, args.config),
                                 args.objective, args.stage, holdout_seeds=holdout,
                                 time_limit_s=args.time_limit, kind=args.kind,
                                 engine=args.engine)
    if not args.quiet and report.summary:
        print(report.summary, end="", file=sys.stderr)
    print(json.dumps({"metrics": report.metrics, "error": report.error,
                      "summary": report.summary}, indent=2, ensure_ascii=False))
    return 0
