"""The ckparity command line. Exit codes: 0 pass, 1 parity fail, 2 usage or input error."""

from __future__ import annotations

import argparse
import json
import platform
import sys


def _info(args: argparse.Namespace) -> int:
    import torch

    import ckparity

    info = {
        "ckparity": ckparity.__version__,
        "torch": torch.__version__,
        "threads": ckparity.get_num_threads(),
        "library": str(ckparity._native.LIBRARY_PATH),
        "build": ckparity.build_info(),
        "cpu": platform.processor() or platform.machine(),
    }
    print(json.dumps(info, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ckparity", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="versions, threads and the loaded library").set_defaults(run=_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
