"""The code the documentation shows works: every call of the package's functions, or of the
scripts' named functions that README.md offers to notebooks, shown in README.md and
docs/reference.md (in a Python block, or inline as `module.function(args)`), names a function that
exists and binds to its signature; a call whose arguments are all literals runs, in a fresh
process, and so does each Python block that calls the package.

Running is what catches a literal of the wrong kind (a `True` where a group of settings is
expected): binding alone would take it. A run ends normally, or with the one-line refusal a
machine without a TPU gives (a UsageError), never with another error.
"""

import ast
import importlib
import inspect
import subprocess
import sys

import pytest
from helpers import REPO, documented_python, subprocess_env

DOCUMENTS = ("README.md", "docs/reference.md")
SCRIPTS = ("run_mlm", "run_classifier", "train_unigram", "prepare_tfrecord_shards")
PACKAGE_MODULES = {path.stem for path in (REPO / "mlm_pipeline").glob("*.py")} - {"__init__"}


class Shown:
    """An argument the documentation shows as a name or an expression (a placeholder for the
    reader's own value), or elides (`...`)."""

    def __init__(self, source):
        self.source = source

    def __repr__(self):
        return self.source


def dotted_name(node):
    """['hosts', 'Hardware'] for `hosts.Hardware`; None for anything but names joined by dots."""
    names = []
    while isinstance(node, ast.Attribute):
        names.insert(0, node.attr)
        node = node.value
    return [node.id, *names] if isinstance(node, ast.Name) else None


def documented_function(call):
    """(module to import, attribute path in it) of a call of the package or of a script."""
    names = dotted_name(call.func)
    if names and names[0] == "mlm_pipeline":
        names = names[1:]
    if not names or len(names) < 2:
        return None
    if names[0] in PACKAGE_MODULES:
        return f"mlm_pipeline.{names[0]}", names[1:]
    if names[0] in SCRIPTS:
        return names[0], names[1:]
    return None


def argument(node, code):
    """(value, whether it is a literal): a literal is evaluated, anything else is Shown."""
    source = ast.get_source_segment(code, node)
    elided = any(
        isinstance(part, ast.Constant) and part.value is Ellipsis for part in ast.walk(node)
    )
    if not elided:
        try:
            return ast.literal_eval(node), True
        except ValueError:
            pass
    return Shown(source), False


def shown_calls():
    """Every call of the package or a script the documents show, with where it is shown."""
    calls = []
    for document in DOCUMENTS:
        blocks, spans = documented_python(document)
        for code in [*blocks, *spans]:
            for node in ast.walk(ast.parse(code)):
                if isinstance(node, ast.Call) and documented_function(node):
                    calls.append((document, code, node))
    return calls


def resolve(call):
    module_name, attributes = documented_function(call)
    target = importlib.import_module(module_name)
    for attribute in attributes:
        target = getattr(target, attribute)
    return target


def run_python(code, cwd):
    """Run `code` in a fresh interpreter in the repository's environment; its CompletedProcess."""
    env = subprocess_env()
    env["PYTHONPATH"] = str(REPO)  # the package and the scripts, as a user's project has them
    env.pop("TPU_LOAD_LIBRARY", None)  # as on a user's machine: nothing set for them
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def ended_well(result):
    """Normally, or refused in one line by this machine (a UsageError, as without a TPU)."""
    if result.returncode == 0:
        return True
    lines = result.stderr.strip().splitlines()
    return bool(lines) and lines[-1].startswith("mlm_pipeline.errors.UsageError: ")


def imports_for(code):
    """The imports that make the package's modules and the scripts named in `code` resolve."""
    names = {name for node in ast.walk(ast.parse(code)) for name in (dotted_name(node) or [])[:1]}
    package = sorted(names & PACKAGE_MODULES)
    lines = [f"import {name}" for name in sorted(names & set(SCRIPTS))]
    if package:
        lines.append(f"from mlm_pipeline import {', '.join(package)}")
    return "\n".join(["import mlm_pipeline", *lines])


def test_the_documents_show_the_recipe_for_ones_own_code():
    """What the next tests check is there to check."""
    shown = {ast.unparse(node.func) for _, _, node in SHOWN_CALLS}
    assert {"tpu_runtime.prepare_runtime", "hosts.build_strategy", "run_mlm.main"} <= shown


SHOWN_CALLS = shown_calls()


@pytest.mark.parametrize(
    "document, code, call",
    SHOWN_CALLS,
    ids=[
        f"{document}: {ast.get_source_segment(code, call)}" for document, code, call in SHOWN_CALLS
    ],
)
def test_every_call_shown_binds_to_its_function(document, code, call, tmp_path):
    function = resolve(call)
    shown = ast.get_source_segment(code, call)
    assert callable(function), f"{document} shows {shown}: not a function"
    if [ast.unparse(node) for node in call.args] == ["..."] and not call.keywords:
        return  # its arguments elided: that the function is there is what can be checked
    assert not any(isinstance(node, ast.Starred) for node in call.args)
    positional = [argument(node, code) for node in call.args]
    named = {keyword.arg: argument(keyword.value, code) for keyword in call.keywords}
    assert None not in named, f"{document} shows {shown}: ** arguments cannot be checked"
    try:
        inspect.signature(function).bind(
            *[value for value, _ in positional],
            **{name: value for name, (value, _) in named.items()},
        )
    except TypeError as error:
        pytest.fail(
            f"{document} shows {shown}, which {function.__qualname__} does not take: {error}"
        )
    if all(literal for _, literal in [*positional, *named.values()]):
        result = run_python(f"{imports_for(shown)}\n{shown}\n", tmp_path)
        assert ended_well(result), f"{document} shows {shown}:\n{result.stderr[-3000:]}"


def python_blocks_calling_the_package():
    return [
        (document, block)
        for document in DOCUMENTS
        for block in documented_python(document)[0]
        if any(
            isinstance(node, ast.Call) and documented_function(node)
            for node in ast.walk(ast.parse(block))
        )
    ]


@pytest.mark.parametrize("document, block", python_blocks_calling_the_package())
def test_every_block_that_calls_the_package_runs(document, block, tmp_path):
    """As it is, on this machine: to its end, or to the line that says this machine has no TPU."""
    result = run_python(block, tmp_path)
    assert ended_well(result), f"{document}'s block:\n{block}\n{result.stderr[-3000:]}"


def test_the_recipe_for_ones_own_code_runs_off_the_tpu(tmp_path):
    """docs/reference.md's recipe with the hardware group its comment gives for GPUs or the CPU:
    to its end, a model built in the strategy's scope."""
    (recipe,) = [
        block for _, block in python_blocks_calling_the_package() if "prepare_runtime" in block
    ]
    assert recipe.count("hardware.Hardware()") == 1
    off_the_tpu = recipe.replace("hardware.Hardware()", "hardware.Hardware(no_tpu=True)")
    checks = "print(type(strategy).__name__, len(model.layers), tf_keras.__name__)\n"
    result = run_python(off_the_tpu + checks, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "_DefaultDistributionStrategy 1 tf_keras"
