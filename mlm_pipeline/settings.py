"""A script's settings declared once: each a field of its group's frozen dataclass, the command line
built from the fields.

A script declares its groups (run_mlm.py's Data, Model, Masking, ...), each field made by
`setting()` with its help, argparse type, choices and default; and one dataclass whose fields are
the groups, named as the groups of `--help`. `parse_command_line()` builds the parser from them,
one argparse argument group a dataclass, a bool field a `store_true` flag and a field without a
default a required one, and returns that dataclass filled in from the command line. Each group
checks its own settings in `__post_init__`, and the whole checks the rules across groups: so a rule
two flags break is refused while the command line is read, before any path is probed or TensorFlow
imported. All four scripts declare their flags this way; a group may be shared (corpus.Corpus, the
two data scripts' corpus flags) or extended by a script's own fields. A `passed_on()` field takes
the flags no group declares, for a script that hands them on (prepare_tfrecord_shards.py --runner:
Beam's pipeline options).

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


def setting(
    help, default=None, *, type=None, choices=None, required=False, aliases=(), several=False
):
    """A group's field: its flag's `help`, argparse `type` (errors.py's positive_int, ...),
    `choices` and `default` (None: not given); `required`, a flag without a default; `aliases`,
    other spellings of the flag that users already type (--export_to_hub for --push_to_hub);
    `several`, a flag that takes one value or more (`--train_dataset A B`), held as a tuple."""
    metadata = {"help": help, "type": type, "choices": choices, "aliases": tuple(aliases)}
    metadata["nargs"] = "+" if several else None
    if required:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def passed_on(what, needs):
    """A group's field that holds the flags the script does not know, as a tuple, to be handed on
    whole to the program that reads them (`what`: "Beam pipeline options"); only with the flag
    `needs` (a field's name, e.g. "runner"), without which they are refused as unknown flags."""
    return dataclasses.field(default=(), metadata={"passed_on": what, "needs": needs})


def build_parser(settings, prog, description, epilog=None):
    """The parser of `settings` (a dataclass of groups): one argument group a field of it, named
    as the field and described by its group's docstring, one flag a field of the group."""
    parser = OneLineErrorParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for group_field in dataclasses.fields(settings):
        group = group_field.type
        add = parser.add_argument_group(group_field.name, group.__doc__).add_argument
        for field in dataclasses.fields(group):
            if "passed_on" in field.metadata:
                continue  # no flag of its own: it holds the flags no group declares
            flags = [f"--{field.name}", *field.metadata["aliases"]]
            options = {"help": field.metadata["help"]}
            if field.metadata["nargs"]:
                options["nargs"] = field.metadata["nargs"]
            if field.type is bool:
                add(*flags, action="store_true", **options)
            elif field.default is dataclasses.MISSING:
                add(*flags, required=True, type=field.metadata["type"], **options)
            else:
                options.update((key, field.metadata[key]) for key in ("type", "choices"))
                add(*flags, default=field.default, **options)
    return parser


def parse_command_line(settings, argv=None, *, prog, description, epilog=None):
    """`settings` (a dataclass of groups) from the command line `argv` (sys.argv's when None). A
    flag argparse refuses exits with status 2, a rule a group or the whole checks with 1; either
    as one line, `<prog>: error: ...`. A group's `passed_on` field, if any, takes the flags no group
    declares (with its `needs` flag; without it they are refused, status 2, as unknown)."""
    parser = build_parser(settings, prog, description, epilog)
    passed = [
        field
        for group_field in dataclasses.fields(settings)
        for field in dataclasses.fields(group_field.type)
        if "passed_on" in field.metadata
    ]
    if passed:
        namespace, unknown = parser.parse_known_args(argv)
        (field,) = passed
        if unknown and not getattr(namespace, field.metadata["needs"]):
            parser.error(
                f"unrecognized arguments: {' '.join(unknown)} ({field.metadata['passed_on']} need "
                f"--{field.metadata['needs']})"
            )
        setattr(namespace, field.name, tuple(unknown))
    else:
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
    """The `group` (a dataclass) of the parsed flags named as its fields; a flag of several values
    as a tuple, which a frozen group cannot have changed under it."""
    values = {field.name: getattr(namespace, field.name) for field in dataclasses.fields(group)}
    return group(
        **{
            name: tuple(value) if isinstance(value, list) else value
            for name, value in values.items()
        }
    )
