"""`blisjax` command line: run | replay | trace | parity | fit-latency | sweep | search.

Thin by design: parse arguments, build a validated configuration and workload, call an engine,
print aggregate metrics JSON on stdout (logs, warnings and the progress line go to stderr). Flags
use BLIS's names and units so a BLIS command line works with ``blis`` replaced by ``blisjax``.

Every input is checked before anything is simulated or written: flags that would have no effect
in the given combination, unreadable input files and unwritable output paths are errors (exit
status 2) naming the flag and the value given. Ctrl-C exits with status 130 and one line.
"""

from __future__ import annotations

from blisjax.cli.adapters import cmd_gepa_evaluate, cmd_openevolve_evaluate
from blisjax.cli.app import COMMANDS, main
from blisjax.cli.common import (
    BASE_RULE,
    ENGINES,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    LLMD_API_VERSIONS,
    LLMD_DEFAULT_API_VERSION,
    default_config_path,
)
from blisjax.cli.compile_cache import (
    PROGRAM_CACHE_ENV,
    CompileCache,
    compile_cache_dir,
    enable_compile_cache,
    program_cache_dir,
)
from blisjax.cli.config_args import WorkloadChoice
from blisjax.cli.export_llmd import cmd_export_llmd
from blisjax.cli.files import (
    check_input_file,
    check_output_dir,
    check_output_path,
    check_text_file,
    reading,
)
from blisjax.cli.fit_latency import cmd_fit_latency
from blisjax.cli.flags import (
    CAPACITIES,
    DISTRIBUTION_FLAGS,
    NOT_CAPACITIES,
    Capacity,
    DistributionFlag,
)
from blisjax.cli.parser import build_parser
from blisjax.cli.run import cmd_parity, cmd_replay, cmd_run, cmd_trace
from blisjax.cli.search_cmds import cmd_explain, cmd_plot, cmd_search, cmd_sweep

__all__ = [
    "BASE_RULE", "CAPACITIES", "COMMANDS", "DISTRIBUTION_FLAGS", "ENGINES", "EXIT_INTERRUPTED",
    "EXIT_INVALID", "LLMD_API_VERSIONS", "LLMD_DEFAULT_API_VERSION", "NOT_CAPACITIES",
    "PROGRAM_CACHE_ENV", "Capacity", "CompileCache", "DistributionFlag", "WorkloadChoice",
    "build_parser", "check_input_file",
    "check_output_dir", "check_output_path", "check_text_file", "cmd_explain",
    "cmd_export_llmd", "cmd_fit_latency", "cmd_gepa_evaluate", "cmd_openevolve_evaluate",
    "cmd_parity", "cmd_plot", "cmd_replay", "cmd_run", "cmd_search", "cmd_sweep", "cmd_trace",
    "compile_cache_dir", "default_config_path", "enable_compile_cache", "main",
    "program_cache_dir", "reading",
]
