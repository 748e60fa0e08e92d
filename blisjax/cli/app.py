"""``main``: parse the command line, set up devices and the compile cache, run the command; and
``COMMANDS``, the command functions by name."""

from __future__ import annotations

import os
import sys

import blisjax.cli.compile_cache as compile_cache
from blisjax.cli.adapters import cmd_gepa_evaluate, cmd_openevolve_evaluate
from blisjax.cli.common import EXIT_INTERRUPTED, EXIT_INVALID
from blisjax.cli.compile_cache import enable_compile_cache
from blisjax.cli.export_llmd import cmd_export_llmd
from blisjax.cli.fit_latency import cmd_fit_latency
from blisjax.cli.parser import build_parser
from blisjax.cli.run import cmd_parity, cmd_replay, cmd_run, cmd_trace
from blisjax.cli.search_cmds import cmd_explain, cmd_plot, cmd_search, cmd_sweep
from blisjax.config import ConfigError
from blisjax.devices import use_cpu_cores, use_platform

COMMANDS = {"run": cmd_run, "replay": cmd_replay, "trace": cmd_trace, "parity": cmd_parity,
            "fit-latency": cmd_fit_latency, "sweep": cmd_sweep, "search": cmd_search,
            "export-llmd": cmd_export_llmd, "plot": cmd_plot, "explain": cmd_explain,
            "gepa-evaluate": cmd_gepa_evaluate, "openevolve-evaluate": cmd_openevolve_evaluate}


def _interrupted() -> int:
    """The exit status after Ctrl-C (the one-line message is already printed)."""
    if "jax" in sys.modules:
        # XLA's compile and run threads may still be working; a normal interpreter exit would
        # tear JAX down under them (observed: a segmentation fault after Ctrl-C during a
        # compile), so leave at once. Outputs are written atomically: none is half-written.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)
    return EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        use_cpu_cores(args.cpu_devices)  # before any command imports JAX
        use_platform(getattr(args, "device", None))
        compile_cache._compile_cache = enable_compile_cache(args.no_compile_cache)
        code = COMMANDS[args.command](args)
        return _interrupted() if code == EXIT_INTERRUPTED else code
    except KeyboardInterrupt:
        print("blisjax: interrupted", file=sys.stderr)
        return _interrupted()
    except BrokenPipeError:  # stdout closed early (`blisjax run | head`): nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 -- so the exit flush cannot fail
        return 1
    except (ConfigError, ValueError, FileNotFoundError, OSError) as exc:
        print(f"blisjax: error: {exc}", file=sys.stderr)
        return EXIT_INVALID
