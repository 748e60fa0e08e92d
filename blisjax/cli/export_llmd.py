"""`export-llmd`: a configuration's routing as an llm-d EndpointPickerConfig."""

from __future__ import annotations

import sys
from typing import Any

from blisjax.atomicio import write_text_atomic
from blisjax.cli.common import log_line
from blisjax.cli.config_args import config_from_args
from blisjax.cli.files import check_outputs
from blisjax.config import ConfigError


def cmd_export_llmd(args: Any) -> int:
    """The base configuration's routing (after the BLIS flags) as an llm-d
    EndpointPickerConfig; a policy with no llm-d counterpart is an error saying why."""
    from search.llmd import check_api_version, endpoint_picker_config

    check_api_version(args.llmd_api_version)
    check_outputs(args, ("out",))
    cfg, base = config_from_args(args)
    export = endpoint_picker_config(cfg, args.llmd_api_version,
                                    header=[f"blisjax export-llmd of {base}"])
    if export.text is None:
        raise ConfigError("policy.routing", f"no llm-d EndpointPickerConfig: {export.reason}")
    if export.left_out and not args.allow_approximation:
        raise ConfigError("policy.routing.scorers", f"{export.refusal()} (pass "
                          "--allow-approximation to write it anyway)")
    write_text_atomic(args.out, export.text)
    if export.left_out:
        print(f"blisjax export-llmd: warning: {args.out} is an approximation: "
              f"{'; '.join(export.left_out)}", file=sys.stderr)
    log_line(args, f"wrote {args.out}")
    return 0
