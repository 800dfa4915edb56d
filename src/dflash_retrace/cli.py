"""`dflash-retrace` command line: each command lives with the package that implements it.

Every module listed in COMMAND_MODULES defines `register_cli(subparsers)`, which adds its parser(s) and sets
`func` (called with the parsed args; its return value is the exit code).
"""

import argparse
import importlib
import sys

COMMAND_MODULES = (
    "dflash_retrace.demo",        # demo (the README's main job)
    "dflash_retrace.assets",      # fetch
    "dflash_retrace.training",    # regenerate, train, corpus
    "dflash_retrace.evaluation",  # bench, gpu-check
    "dflash_retrace.hub",         # export, push, templates, payload
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflash-retrace", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register_cli(subparsers)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
