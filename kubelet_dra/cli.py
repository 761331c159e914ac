"""The ``kubelet-dra-health`` command: the sidecar and the tools.

The only module that configures logging and handles signals. Each
subcommand lives in its own ``_cmd_*`` function registered in
:func:`build_parser`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from kubelet_dra import __version__, cachecmd

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubelet-dra-health",
        description="The kubelet's DRA device-health pipeline: sidecar, demo and tools.",
    )
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logs")
    parser.add_argument("--log-format", choices=["text", "json"], default="text")
    commands = parser.add_subparsers(dest="command", required=True)
    cachecmd.add_parser(commands)
    return parser


def configure_logging(verbosity: int, fmt: str) -> None:
    level = logging.WARNING - 10 * min(verbosity + 1, 2)
    logging.basicConfig(level=level, stream=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    configure_logging(ns.verbose, ns.log_format)
    return int(ns.handler(ns))
