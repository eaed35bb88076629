"""The shape of the code that a reader relies on: README's "What to copy for each step" names
exactly the package modules each script needs (its imports, followed through the package), the
package imports no script, no script routes flag values through tables of flag names, and the
formatter is never switched off.
"""

import ast
import re

import pytest
from helpers import REPO

SCRIPTS = {
    "1": "train_unigram.py",
    "2": "prepare_tfrecord_shards.py",
    "3": "run_mlm.py",
    "4": "run_classifier.py",
}
PACKAGE = REPO / "mlm_pipeline"


def package_imports(path):
    """The mlm_pipeline modules a file imports anywhere in it (imports inside functions count: a
    script loads some of them only on the path that needs them)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    in_package = path.parent == PACKAGE
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            relative_package = in_package and node.level == 1 and not node.module
            if node.module == "mlm_pipeline" or relative_package:
                modules |= {alias.name for alias in node.names}
            elif node.module and node.module.startswith("mlm_pipeline."):
                modules.add(node.module.split(".")[1])
            elif in_package and node.level == 1:
                modules.add(node.module)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mlm_pipeline."):
                    modules.add(alias.name.split(".")[1])
    return modules


def closure(script):
    """The package modules a script needs: its own imports and theirs, to the end."""
    needed, waiting = set(), list(package_imports(REPO / script))
    while waiting:
        module = waiting.pop()
        if module not in needed:
            needed.add(module)
            waiting += package_imports(PACKAGE / f"{module}.py")
    return needed


def readme_copy_lists():
    """{step: (script, {module names})} from README's "What to copy for each step" table."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("### What to copy for each step", 1)[1].split("\n#", 1)[0]
    rows = {}
    for match in re.finditer(r"^\| (\d) \| `([\w.]+)` \| (.+?) \|$", section, re.MULTILINE):
        step, script, modules = match.groups()
        rows[step] = (script, set(re.findall(r"`(\w+)\.py`", modules)))
    return rows


@pytest.mark.parametrize("step", sorted(SCRIPTS))
def test_readme_names_what_each_step_needs(step):
    script = SCRIPTS[step]
    rows = readme_copy_lists()
    assert step in rows, f"README's copy table has no row for step {step} ({script})"
    named_script, named_modules = rows[step]
    assert named_script == script
    needed = closure(script) | {"__init__"}
    assert named_modules == needed, (
        f"README's copy list for {script}: missing {sorted(needed - named_modules)}, "
        f"not needed {sorted(named_modules - needed)}"
    )


def test_the_package_imports_no_script():
    scripts = {path.stem for path in REPO.glob("*.py")}
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = {node.module.split(".")[0]}
            else:
                continue
            assert not names & scripts, f"{path.name} imports the script {names & scripts}"


def test_no_table_of_flag_names_routes_values():
    """Module-level tuples named *_FLAGS were how values once reached functions by string; values
    go by name now (`build_model(config, learning_rate=args.learning_rate, ...)`)."""
    for path in sorted(REPO.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        tables = [
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name) and target.id.endswith("_FLAGS")
        ]
        assert tables == [], f"{path.name} routes flags through {tables}"


def test_the_formatter_is_never_switched_off():
    files = [*REPO.glob("*.py"), *PACKAGE.glob("*.py"), *(REPO / "benchmarks").glob("*.py")]
    files += (REPO / "tests").glob("*.py")
    marker = "fmt: " + "skip"  # spelled in two parts so this file does not match itself
    switched_off = [path.name for path in files if marker in path.read_text(encoding="utf-8")]
    assert switched_off == []
