"""Bad input as one line: the error type the scripts raise for it, and how they report it.

Every check in the pipeline raises `UsageError` with a sentence that names the flag, the value and
what to do. `exit_on_usage_error()` turns it into `<script>.py: error: <sentence>` and exit status
1, with no traceback; argparse's own complaints (a missing or malformed flag) become one line with
status 2.
"""

import argparse
import re
import sys


class UsageError(Exception):
    """A mistake in the user's input: reported as one line, without a traceback."""


def first_line(error):
    """A library error on one line: its own first line, and the root cause's when that differs."""

    def describe(exception):
        text = str(exception).strip()
        return (
            f"{type(exception).__name__}: {text.splitlines()[0]}"
            if text
            else type(exception).__name__
        )

    root = error
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__
    return describe(error) if root is error else f"{describe(error)} ({describe(root)})"


def tf_error_text(error):
    """TF's own words from an op error, without the function and op names it wraps them in."""
    text = str(error).strip()
    text = text.splitlines()[0] if text else ""
    text = re.sub(r"\{\{function_node [^}]*\}\}|\[Op:[^\]]*\].*$", "", text).strip()
    return text or type(error).__name__


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line that points at --help instead of the whole usage
    block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text):
    """argparse type: a whole number above 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive number")
    return value


def non_negative_int(text):
    """argparse type: a whole number, 0 or above."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be 0 or a positive number")
    return value


# argparse names the type in its own message ("invalid positive_int value:
# 'ten'"): say "int" instead.
positive_int.__name__ = non_negative_int.__name__ = "int"


def exit_on_usage_error(main, args, script):
    """Run `main(args)`; a UsageError ends the process with `<script>: error: ...` and status 1."""
    try:
        return main(args)
    except UsageError as error:
        sys.exit(f"{script}: error: {error}")
