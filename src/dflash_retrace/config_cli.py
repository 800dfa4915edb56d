"""Command-line options generated from a config dataclass, as transformers' `HfArgumentParser` does.

A field becomes `--field-name`; its metadata gives `help`, `choices` and (for lists or custom parsing) `type`.
`X | None` parses as X. A bool field defaulting to False is a flag (`--lora`); one defaulting to True gets
`--no-field-name`. The default is appended to the help text, so it is written once, in the dataclass. Metadata
`flag` renames the option, `cli_default` gives the command line another default than the Python API.
"""

from __future__ import annotations

import dataclasses
import types
import typing

__all__ = ["add_config_arguments", "comma_ints", "config_from_args", "option"]


def option(default=dataclasses.MISSING, help: str = "", **metadata):
    """A dataclass field with its command-line help (and optional `choices`, `type`)."""
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


def comma_ints(text: str) -> list:
    """`"1,14,27"` -> [1, 14, 27]."""
    return [int(x) for x in text.split(",") if x.strip()]


def _base_type(hint):
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else str
    return typing.get_origin(hint) or hint


def add_config_arguments(parser, config_class, skip=()) -> None:
    """Adds one option per field of `config_class` (except `skip`) to an argparse parser."""
    hints = typing.get_type_hints(config_class)
    for f in dataclasses.fields(config_class):
        if f.name in skip:
            continue
        meta = dict(f.metadata)
        text = meta.pop("help", "")
        default = meta.pop("cli_default", f.default)
        kind = _base_type(hints[f.name])
        if kind is bool:
            negative = default is True
            flag = meta.pop("flag", ("--no-" if negative else "--") + f.name.replace("_", "-"))
            parser.add_argument(flag, dest=f.name, action="store_false" if negative else "store_true",
                                help=f"turn off: {text}" if negative else text)
            continue
        flag = meta.pop("flag", "--" + f.name.replace("_", "-"))
        kwargs = {"type": meta.pop("type", kind), **meta}
        if default is dataclasses.MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
            if default is not None:
                text += f" (default: {default})"
        parser.add_argument(flag, dest=f.name, help=text, **kwargs)


def config_from_args(config_class, args, **overrides):
    """`config_class` filled from parsed args (fields only) and `overrides`."""
    names = {f.name for f in dataclasses.fields(config_class)}
    values = {k: v for k, v in vars(args).items() if k in names}
    return config_class(**{**values, **overrides})
