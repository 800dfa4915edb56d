"""`dflash-retrace` command line: each command lives with the package that implements it.

Every module listed in COMMAND_MODULES defines `register_cli(subparsers)`, which adds its parser(s) and sets
`func` (called with the parsed args; its return value is the exit code).

Errors: an input error (a wrong value, a missing file or folder, no network) prints one line and exits 2; any
other exception prints one line and exits 1; `--debug` (anywhere on the command line) shows the traceback.
"""

import argparse
import importlib
import sys

# Exception classes (by name, anywhere in the cause chain) that mean the network or the Hub was unreachable.
_OFFLINE = {"ConnectError", "ConnectTimeout", "NetworkError", "ConnectionError", "OfflineModeIsEnabled",
            "LocalEntryNotFoundError", "gaierror", "MaxRetryError", "NewConnectionError"}
OFFLINE_HINT = ("offline: the Hugging Face Hub could not be reached. Check the network (HF_HUB_OFFLINE=1 uses cached "
                "files only); uploads and private repos need a token (set HF_TOKEN or run `huggingface-cli login`)")

COMMAND_MODULES = (
    "dflash_retrace.demo",        # demo (the README's main job)
    "dflash_retrace.assets",      # fetch
    "dflash_retrace.training",    # regenerate, train, features, corpus
    "dflash_retrace.evaluation",  # bench, gpu-check, replay
    "dflash_retrace.hub",         # export, push, templates, payload
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflash-retrace", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (accepted anywhere on the line)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register_cli(subparsers)
    return parser


def _chain(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def error_line(err: BaseException) -> tuple:
    """(one-line message, exit code) for an exception a command raised: 2 for input errors, 1 otherwise."""
    text = " ".join(str(err).split()) or type(err).__name__
    offline = any({c.__name__ for c in type(e).__mro__} & _OFFLINE or "couldn't connect" in str(e)
                  for e in _chain(err))
    ours = isinstance(err, (ValueError, OSError))  # the library's input errors carry the fix in the message
    if offline:
        return f"{text if ours else f'{type(err).__name__}: {text}'} | {OFFLINE_HINT}", 2
    if ours:
        return text, 2
    return f"{type(err).__name__}: {text} (unexpected: rerun with --debug for the traceback, and report it)", 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except Exception as err:  # noqa: BLE001 - every error becomes one line unless --debug
        if debug:
            raise
        message, code = error_line(err)
        print(f"dflash-retrace {args.command}: error: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
