"""Bad input as one line: the error type the scripts raise for it, and how they report it.

Every check in the pipeline raises `UsageError` with a sentence that names the flag, the value and
what to do. `exit_on_usage_error()` turns it into `<script>.py: error: <sentence>` and exit status
1, with no traceback; argparse's own complaints (a missing or malformed flag) become one line with
status 2.
"""

import argparse
import math
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


def finite_float(text):
    """A number as argparse reads it; nan and inf, which no setting of a run means, refused."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number")
    return value


def probability(text):
    """argparse type: a share strictly between 0 and 1 (of the tokens masked, of the steps)."""
    value = finite_float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} must lie strictly between 0 and 1")
    return value


def fraction_below_one(text):
    """argparse type: a number from 0 up to, but not including, 1 (a warmup share, Adam's betas)."""
    value = finite_float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} must be 0 or more and below 1")
    return value


def positive_float(text):
    """argparse type: a number above 0 (a learning rate, Adam's epsilon)."""
    value = finite_float(text)
    if value <= 0.0:
        raise argparse.ArgumentTypeError(f"{text} must be a number above 0")
    return value


def non_negative_float(text):
    """argparse type: 0 or a number above it (a weight decay, a clipping norm where 0 is off)."""
    value = finite_float(text)
    if value < 0.0:
        raise argparse.ArgumentTypeError(f"{text} must be 0 or a number above 0")
    return value


# argparse names the type in its own message ("invalid positive_int value: 'ten'"): name the kind
# of number the user typed wrong instead.
positive_int.__name__ = non_negative_int.__name__ = "int"
for number_type in (
    finite_float,
    probability,
    fraction_below_one,
    positive_float,
    non_negative_float,
):
    number_type.__name__ = "float"


def exit_on_usage_error(main, args, script):
    """Run `main(args)`; a UsageError ends the process with `<script>: error: ...` and status 1."""
    try:
        return main(args)
    except UsageError as error:
        sys.exit(f"{script}: error: {error}")
