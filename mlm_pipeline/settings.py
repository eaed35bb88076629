"""A script's settings declared once: each a field of its group's frozen dataclass, the command line
built from the fields.

A script declares its groups (run_mlm.py's Data, Model, Masking, ...), each field made by
`setting()` with its help, argparse type, choices and default; and one dataclass whose fields are
the groups, named as the groups of `--help`. `parse_command_line()` builds the parser from them,
one argparse argument group a dataclass, a bool field a `store_true` flag and a field without a
default a required one, and returns that dataclass filled in from the command line. Each group
checks its own settings in `__post_init__`, and the whole checks the rules across groups: so a rule
two flags break is refused while the command line is read, before any path is probed or TensorFlow
imported.

Why not transformers' HfArgumentParser, which builds a parser from dataclasses too: it would change
the command line and its errors. It adds a hyphenated twin of every flag (`--train-dataset` beside
`--train_dataset`); a bool field takes a value (`--bfloat16 True`, `--bfloat16 false`), and one
whose default is True gets a `--no_<name>` complement; the field's annotation replaces the argparse
type given in its metadata, so `--warmup_ratio 1.5` would no longer be refused by its range; and it
is a plain ArgumentParser (the whole usage block on a bad flag, a ValueError's traceback on an
unknown one) where the scripts answer in one line (errors.OneLineErrorParser).
"""

import argparse
import dataclasses

from .errors import OneLineErrorParser, UsageError


def setting(help, default=None, *, type=None, choices=None, required=False):
    """A group's field: its flag's `help`, argparse `type` (errors.py's positive_int, ...),
    `choices` and `default` (None: not given); `required`, a flag without a default."""
    metadata = {"help": help, "type": type, "choices": choices}
    if required:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def build_parser(settings, prog, description):
    """The parser of `settings` (a dataclass of groups): one argument group a field of it, named
    as the field and described by its group's docstring, one flag a field of the group."""
    parser = OneLineErrorParser(
        prog=prog, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    for group_field in dataclasses.fields(settings):
        group = group_field.type
        add = parser.add_argument_group(group_field.name, group.__doc__).add_argument
        for field in dataclasses.fields(group):
            flag, help = f"--{field.name}", field.metadata["help"]
            if field.type is bool:
                add(flag, action="store_true", help=help)
            elif field.default is dataclasses.MISSING:
                add(flag, required=True, type=field.metadata["type"], help=help)
            else:
                options = {key: field.metadata[key] for key in ("type", "choices")}
                add(flag, default=field.default, help=help, **options)
    return parser


def parse_command_line(settings, argv=None, *, prog, description):
    """`settings` (a dataclass of groups) from the command line `argv` (sys.argv's when None). A
    flag argparse refuses exits with status 2, a rule a group or the whole checks with 1; either
    as one line, `<prog>: error: ...`."""
    parser = build_parser(settings, prog, description)
    namespace = parser.parse_args(argv)
    try:
        groups = {
            group_field.name: group_from(namespace, group_field.type)
            for group_field in dataclasses.fields(settings)
        }
        return settings(**groups)
    except UsageError as error:
        parser.exit(1, f"{prog}: error: {error}\n")


def group_from(namespace, group):
    """The `group` (a dataclass) of the parsed flags named as its fields."""
    return group(
        **{field.name: getattr(namespace, field.name) for field in dataclasses.fields(group)}
    )
