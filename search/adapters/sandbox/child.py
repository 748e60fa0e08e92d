"""The child side of the sandbox (``python -m search.adapters.sandbox``): ``serve`` loads the
experiment, imports what the run needs, sets the CPU-time and address-space limits, loads the
program under the allowlist, simulates every case in the reference engine (the first one traced
when a summary is asked for) and ``classify`` turns whatever went wrong into a ``SandboxError``.
It imports the simulator inside its functions, so importing the package stays light (no JAX)."""

from __future__ import annotations

import ast
import importlib
import json
import math
import os
import resource
import signal
import sys
import traceback
from collections.abc import Mapping
from typing import Any, NamedTuple

from search.adapters.sandbox.errors import (
    TRACEBACK_LINES,
    CpuTimeExceeded,
    Failure,
    Forbidden,
    SandboxError,
)
from search.adapters.sandbox.guard import _Output, load_program

__all__ = ["classify", "main", "serve"]

#: CPU seconds between the soft limit (SIGXCPU: a clean ``timeout``) and the hard one (SIGKILL).
HARD_CPU_GRACE_S = 5


class Policy(NamedTuple):
    """A loaded program as a policy: its ``kind``, the experiment's configuration with the
    program's sections (bundle) and the program's functions (code; None for a bundle)."""

    kind: str
    config: Any  # SimConfig
    code_policy: Any  # CodePolicy | None


def _program_kind(namespace: Mapping[str, Any], kind: str) -> str:
    has_bundle = callable(namespace.get("policy"))
    has_code = any(callable(namespace.get(n)) for n in ("route_scores", "priority"))
    if kind == "auto":
        if has_bundle and has_code:
            raise Failure("invalid_policy", "the program defines both policy() and "
                                            "route_scores/priority; define one kind")
        kind = "bundle" if has_bundle else "code"
    if kind == "bundle" and not has_bundle:
        raise Failure("invalid_policy", "a bundle program must define policy() returning the "
                                        "policy-bundle sections")
    if kind == "code" and not has_code:
        raise Failure("invalid_policy", "the program defines neither policy() (a bundle) nor "
                                        "route_scores(request, instances) / "
                                        "priority(request, now_us) (a code policy)")
    return kind


def _bundle_sections(value: Any) -> dict[str, str]:
    """``policy()``'s value as candidate sections (YAML text per component)."""
    import yaml

    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise Failure("invalid_policy",
                          f"policy() returned YAML that does not parse: {e}") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise Failure("invalid_policy", "policy() must return a dict of policy-bundle sections "
                                        f"(or their YAML), got {type(value).__name__}")
    sections = {}
    for name, body in value.items():
        try:
            sections[name] = body if isinstance(body, str) else yaml.safe_dump(
                {name: body}, sort_keys=False)
        except yaml.YAMLError as e:
            raise Failure("invalid_policy", f"section {name!r} is not plain data: {e}") from None
    return sections


def _policy(namespace: Mapping[str, Any], kind: str, config: Any) -> Policy:
    from blisjax.config import ConfigError, resolve_config
    from blisjax.reference.code_policy import CodePolicy

    kind = _program_kind(namespace, kind)
    if kind == "code":
        return Policy(kind, config, CodePolicy(namespace.get("route_scores"),
                                               namespace.get("priority")))
    from search.adapters.core import candidate_config

    sections = _bundle_sections(namespace["policy"]())
    try:
        cfg = candidate_config(config, sections)
        resolve_config(cfg)  # cross-field checks
    except (ConfigError, ValueError) as e:
        raise Failure("invalid_policy", str(e)) from None
    return Policy(kind, cfg, None)


class Experiment(NamedTuple):
    """The child's experiment: its configuration and the compiled objective."""

    config: Any  # SimConfig
    objective: Any  # search.expr.Expression


def _experiment(config_path: str, objective: str) -> Experiment:
    from blisjax.config import ConfigError, load_config
    from search.expr import compile_expression

    try:
        config = load_config(config_path)
        expr = compile_expression(objective)
    except (ConfigError, OSError, ValueError) as e:
        raise Failure("settings", str(e)) from None
    if config.workload is None:
        raise Failure("settings", f"{config_path} has no workload section (each case generates "
                                  f"its workload from it)")
    return Experiment(config, expr)


def _traced_run(resolved: Any, workload: Any, code_policy: Any,
                counterfactual_k: int) -> tuple[Any, list[dict[str, Any]]]:
    """A traced reference run at level ``decisions``: (result, trace lines)."""
    from blisjax.trace.run import simulate_traced

    result, trace = simulate_traced(resolved, workload, "decisions", counterfactual_k,
                                    code_policy=code_policy)
    return result, list(trace.lines())


def _code_policy_note(code_policy: Any) -> str:
    replaced = [text for fn, text in (
        (code_policy.route_scores, "routing by the program's route_scores"),
        (code_policy.priority, "queue priority by the program's priority")) if fn is not None]
    return (f"Note: this run is a code policy — {' and '.join(replaced)}; the configured "
            f"templates named below are replaced by the functions, so act on suggestions "
            f"that name template knobs by changing the functions.\n\n")


def _summary(policy: Policy, result: Any, workload: Any, metrics: dict[str, Any],
             lines: list[dict[str, Any]], spec: Mapping[str, Any]) -> str:
    """The text summary of a traced run (no program code runs here: a failure is the
    summariser's, so it is reported in the summary and does not fail the program)."""
    from blisjax.metrics import per_request_rows
    from blisjax.trace.reflect import reflection_text

    try:
        text = reflection_text(lines, metrics, policy.config, spec["strategy"],
                               int(spec["max_tokens"]),
                               requests=per_request_rows(result, workload))
    except MemoryError:
        raise
    except Exception as e:
        text = f"(no trace summary: the summariser failed: {type(e).__name__}: {e})\n"
    return text if policy.code_policy is None else _code_policy_note(policy.code_policy) + text


def _run_case(experiment: Experiment, policy: Policy, case: Mapping[str, Any],
              summary: Mapping[str, Any] | None) -> tuple[dict[str, Any], str]:
    """Simulate one case: (its JSON result, its summary or '')."""
    from blisjax.config import resolve_config
    from blisjax.metrics import config_metrics
    from blisjax.reference.cluster import ClusterSimulator
    from blisjax.workload import workload_from_section
    from search.expr import flatten_metrics

    cfg = policy.config
    seed = experiment.config.seed if case.get("seed") is None else int(case["seed"])
    workload = workload_from_section(cfg.workload, seed)
    if case.get("requests") is not None:
        workload = workload.head(int(case["requests"]))
    resolved = resolve_config(cfg)
    if summary is not None:  # the traced run's result is the untraced run's, bit for bit
        result, lines = _traced_run(resolved, workload, policy.code_policy,
                                    int(summary["counterfactual_k"]))
    else:
        result = ClusterSimulator(resolved, workload, code_policy=policy.code_policy).run()
    metrics = config_metrics(result, workload, cfg)
    flat = flatten_metrics(metrics)
    try:
        value = experiment.objective.evaluate(flat, "objective")
    except (ValueError, KeyError) as e:  # ConfigError is a ValueError: an unknown metric name
        raise Failure("settings", str(e)) from None
    text = "" if summary is None else _summary(policy, result, workload, metrics, lines, summary)
    return ({"name": case["name"], "seed": seed, "requests": int(workload.num_requests),
             "objective": float(value), "metrics": flat}, text)


def _defines_policy(source: str) -> bool:
    """Whether the program defines ``policy`` at module level (a bundle program, probably)."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    return any((isinstance(n, ast.FunctionDef) and n.name == "policy")
               or (isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "policy" for t in n.targets))
               for n in body)


def _preload(bundle: bool) -> None:
    """Import what the run will need before the limits apply: the limits are the program's
    (and its simulations'), not the simulator's start-up. ``search.adapters.core`` (bundles
    only) brings JAX along, a second of start-up a code policy does without."""
    importlib.import_module("blisjax.metrics")
    importlib.import_module("blisjax.reference.cluster")
    importlib.import_module("blisjax.trace.run")
    importlib.import_module("blisjax.trace.reflect")
    importlib.import_module("blisjax.workload")
    importlib.import_module("yaml")
    if bundle:
        importlib.import_module("search.adapters.core")


def _on_cpu_limit(signum: int, frame: Any) -> None:
    raise CpuTimeExceeded


def _apply_limits(cpu_s: float, memory_mb: float) -> None:
    """CPU and address-space limits counted from now (start-up is the simulator's, not the
    program's): SIGXCPU at the soft CPU limit becomes ``CpuTimeExceeded``."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(math.ceil(usage.ru_utime + usage.ru_stime + cpu_s))
    _, hard_now = resource.getrlimit(resource.RLIMIT_CPU)
    hard = soft + HARD_CPU_GRACE_S
    if hard_now != resource.RLIM_INFINITY:
        soft, hard = min(soft, hard_now), min(hard, hard_now)
    signal.signal(signal.SIGXCPU, _on_cpu_limit)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    try:  # Linux: the address space in use now, plus the program's share
        with open("/proc/self/statm") as fh:
            in_use = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return
    limit = in_use + int(memory_mb * 2**20)
    _, hard_as = resource.getrlimit(resource.RLIMIT_AS)
    if hard_as == resource.RLIM_INFINITY or limit <= hard_as:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit if hard_as ==
                                                resource.RLIM_INFINITY else hard_as))


def _traceback_tail(exc: BaseException) -> str:
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).splitlines()
    return "\n".join(lines[-TRACEBACK_LINES:])


def classify(exc: BaseException, cpu_s: float) -> SandboxError:
    """The ``SandboxError`` of an exception raised while loading or running the program."""
    from blisjax.reference.code_policy import CodePolicyError

    if isinstance(exc, Failure):
        return SandboxError(exc.kind, str(exc))
    if isinstance(exc, CpuTimeExceeded):
        return SandboxError("timeout", f"the program used more than {cpu_s:g} s of CPU time")
    if isinstance(exc, Forbidden):
        return SandboxError("forbidden_import", str(exc))
    if isinstance(exc, MemoryError) or isinstance(exc.__cause__, MemoryError):
        return SandboxError("memory", "the program ran out of memory")
    if isinstance(exc, CodePolicyError):
        if exc.__cause__ is None:  # a decision that is not a valid one
            return SandboxError("invalid_policy", str(exc))
        return SandboxError("crash", f"{exc}\n{_traceback_tail(exc.__cause__)}")
    return SandboxError("crash", f"{type(exc).__name__}: {exc}\n{_traceback_tail(exc)}")


def serve(request: Mapping[str, Any]) -> dict[str, Any]:
    """The child's work: the JSON response to a request (never raises for the program)."""
    import random

    # the allowlisted ``statistics.NormalDist.samples`` draws from the global generator when
    # unseeded: seeded, a program gets the same numbers in every run
    random.seed(0)
    output = _Output()
    kind: str | None = None
    try:
        experiment = _experiment(request["config_path"], request["objective"])
        _preload(request["kind"] == "bundle" or (
            request["kind"] == "auto" and _defines_policy(request["source"])))
        _apply_limits(float(request["cpu_s"]), float(request["memory_mb"]))
        policy = _policy(load_program(request["source"], output), request["kind"],
                         experiment.config)
        kind = policy.kind
        cases, summary = [], ""
        for i, case in enumerate(request["cases"]):
            result, text = _run_case(experiment, policy, case,
                                     request["summary"] if i == 0 else None)
            cases.append(result)
            summary = summary or text
        return {"kind": kind, "cases": cases, "summary": summary, "error": None,
                "output": output.text()}
    except BaseException as exc:  # the program's failure, whatever it is, is the response
        error = classify(exc, float(request.get("cpu_s", 0)))
        return {"kind": kind, "cases": [], "summary": "", "error": error._asdict(),
                "output": output.text()}


def main() -> int:
    """Child entry point: request JSON on stdin, response JSON on stdout."""
    response_fd = os.dup(1)
    os.dup2(2, 1)  # anything else printing to stdout must not corrupt the response
    sys.stdout = sys.stderr
    response = serve(json.loads(sys.stdin.read()))
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)  # the work is done: write the response
    with os.fdopen(response_fd, "w", encoding="utf-8") as fh:
        json.dump(response, fh)
    return 0
