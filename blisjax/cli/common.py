"""Constants, the default configuration's path and the stderr message helpers shared by the
commands."""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import Any

ENGINES = ("reference", "jax")
#: apiVersion values of ``export-llmd`` (``search.llmd``'s, named here so the parser does not
#: import the search package).
LLMD_API_VERSIONS = ("llm-d.ai/v1alpha1", "inference.networking.x-k8s.io/v1alpha1")
LLMD_DEFAULT_API_VERSION = LLMD_API_VERSIONS[0]
#: Exit status of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130
#: Exit status of invalid input.
EXIT_INVALID = 2

#: The rule every simulating command follows for its starting configuration.
BASE_RULE = ("Base configuration: --config FILE if given, else the shipped default experiment "
             "(configs/default.yaml: 4 instances, weighted routing, two tenants). A workload "
             "given by --workload-spec, --workload distribution or a trace replaces only the "
             "base's workload; --policy-config and the flags then override single fields. A "
             "trace written by `trace` and replayed by `replay` with the same --config "
             "reproduces `run` exactly.")


def default_config_path() -> Path:
    """The shipped default experiment (package data, so it works from any install)."""
    return Path(str(resources.files("blisjax") / "data" / "default.yaml"))


def log_line(args: Any, msg: str) -> None:
    """An informational stderr line (silenced by --quiet)."""
    if not getattr(args, "quiet", False):
        print(f"blisjax: {msg}", file=sys.stderr)


def warn(msg: str) -> None:
    """A warning on stderr (always shown; the exit status is unchanged)."""
    print(f"blisjax: warning: {msg}", file=sys.stderr)


def flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")
