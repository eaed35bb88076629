#!/usr/bin/env python
"""Write a small English corpus that every Python installation already carries: no download needed.

The text is CPython's own documentation: the help topics of `pydoc_data.topics` and the docstrings
of the standard library's pure-Python modules. Each paragraph becomes one line; every 20th paragraph
goes to the validation file. The output depends only on the Python version, so the quickstart is
repeatable.

    python make_quickstart_corpus.py --output_dir quickstart_data
    # -> quickstart_data/train.txt, quickstart_data/validation.txt
"""

import argparse
import ast
import os
import re
import sys
import sysconfig

VALIDATION_EVERY = 20
MIN_PARAGRAPH_WORDS = 4


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Write a train/validation corpus from CPython's documentation."
    )
    parser.add_argument(
        "--output_dir", required=True, help="The folder to write train.txt and validation.txt into."
    )
    return parser.parse_args(argv)


def paragraphs(text):
    """Split on blank lines and fold each paragraph onto one line of words."""
    for block in re.split(r"\n\s*\n", text):
        words = block.split()
        if len(words) >= MIN_PARAGRAPH_WORDS:
            yield " ".join(words)


def help_topics():
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield from paragraphs(topics[name])


def standard_library_docstrings():
    """Docstrings read with `ast`, so no module is imported (and none of their side effects run)."""
    library = sysconfig.get_paths()["stdlib"]
    for folder, subfolders, files in os.walk(library):
        subfolders[:] = sorted(
            d for d in subfolders if d not in {"test", "tests", "idlelib", "site-packages"}
        )
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as source:
                    tree = ast.parse(source.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(
                    node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
                ):
                    docstring = ast.get_docstring(node)
                    if docstring:
                        yield from paragraphs(docstring)


def main(args):
    os.makedirs(args.output_dir, exist_ok=True)
    counts = {"train": 0, "validation": 0}
    seen = set()
    paths = {split: os.path.join(args.output_dir, f"{split}.txt") for split in counts}
    with (
        open(paths["train"], "w", encoding="utf-8") as train,
        open(paths["validation"], "w", encoding="utf-8") as validation,
    ):
        for paragraph in (*help_topics(), *standard_library_docstrings()):
            if paragraph in seen:  # many docstrings repeat verbatim (overrides, aliases)
                continue
            seen.add(paragraph)
            index = len(seen)
            split = "validation" if index % VALIDATION_EVERY == 0 else "train"
            (validation if split == "validation" else train).write(paragraph + "\n")
            counts[split] += 1
    print(
        f"Wrote {counts['train']} train and {counts['validation']} validation paragraphs to "
        f"{args.output_dir}"
    )
    return paths


if __name__ == "__main__":
    if sys.version_info < (3, 8):
        sys.exit("make_quickstart_corpus.py: error: needs Python 3.8 or newer.")
    main(parse_args())
