"""The shape of the code that a reader relies on: README's "What to copy for each step" names
exactly the package modules each script needs (its imports, followed through the package) and how
many lines that copy is, the package's own index (mlm_pipeline/__init__.py) lists every module once
with the steps that need it, the package imports no script, no script routes flag values through
tables of flag names, and the formatter is never switched off.
"""

import ast
import functools
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


@functools.lru_cache(maxsize=None)
def package_imports(path, core=False):
    """The mlm_pipeline modules a file imports: anywhere in it, or with `core` those it loads
    whatever its flags: its top-level imports and, in a script, main()'s crossing into the engine
    (imported in main's own body, after the TPU's start-up). A module imported inside another
    function loads only on the path that needs it: an optional feature's, which its flag asks for.
    A module a file runs by name in a child process (f"{__package__}.name") counts as imported."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    in_package = path.parent == PACKAGE
    nodes = list(ast.walk(tree))
    if core:
        nodes = list(tree.body)
        mains = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
        for main in (node for node in mains if node.name == "main" and not in_package):
            nodes += crossing_statements(main.body)
    modules = set()
    for node in nodes:
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
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.JoinedStr):
            modules |= run_by_name(node.value)
    return frozenset(modules)


def crossing_statements(body):
    """main()'s statements, and those of the `with` blocks in it (the start-up log held back
    around the engine's import), but not those under a condition."""
    statements = []
    for statement in body:
        statements.append(statement)
        if isinstance(statement, ast.With):
            statements += crossing_statements(statement.body)
    return statements


def run_by_name(joined):
    """{name} of an f-string f"{__package__}.name": a package module a child process runs."""
    parts = joined.values
    if len(parts) == 2 and isinstance(parts[0], ast.FormattedValue):
        package, name = parts[0].value, parts[1]
        if isinstance(package, ast.Name) and package.id == "__package__":
            if isinstance(name, ast.Constant) and str(name.value).startswith("."):
                return {name.value[1:]}
    return set()


def closure(script, core=False):
    """The package modules a script needs: its own imports and theirs, to the end; with `core`,
    those it loads whatever its flags (top-level imports only)."""
    needed, waiting = set(), list(package_imports(REPO / script, core))
    while waiting:
        module = waiting.pop()
        if module not in needed:
            needed.add(module)
            waiting += package_imports(PACKAGE / f"{module}.py", core)
    return needed


def lines_to_copy(script, modules):
    """The lines of a step's copy: its script and `modules`, __init__.py included."""
    files = [REPO / script] + [PACKAGE / f"{module}.py" for module in modules | {"__init__"}]
    return sum(len(path.read_text(encoding="utf-8").splitlines()) for path in files)


def readme_copy_lists():
    """{step: (script, {core modules}, {optional modules}, core lines, all lines)} from README's
    "What to copy for each step" table."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("### What to copy for each step", 1)[1].split("\n#", 1)[0]
    rows = {}
    row = r"^\| (\d) \| `([\w.]+)` \| (.+?) \| (.*?) \| ([\d,]+) \| ([\d,]+) \|$"
    for match in re.finditer(row, section, re.MULTILINE):
        step, script, core, optional, core_lines, all_lines = match.groups()
        modules = [set(re.findall(r"`(\w+)\.py`", cell)) for cell in (core, optional)]
        counts = [int(cell.replace(",", "")) for cell in (core_lines, all_lines)]
        rows[step] = (script, *modules, *counts)
    return rows


@pytest.mark.parametrize("step", sorted(SCRIPTS))
def test_readme_names_what_each_step_needs(step):
    script = SCRIPTS[step]
    rows = readme_copy_lists()
    assert step in rows, f"README's copy table has no row for step {step} ({script})"
    named_script, named_core, named_optional, core_lines, all_lines = rows[step]
    assert named_script == script
    core = closure(script, core=True) | {"__init__"}
    optional = closure(script) - core
    for kind, named, needed in (("core", named_core, core), ("optional", named_optional, optional)):
        assert named == needed, (
            f"README's {kind} modules for {script}: missing {sorted(needed - named)}, "
            f"not needed {sorted(named - needed)}"
        )
    for kind, named, lines in (
        ("core", core_lines, lines_to_copy(script, core)),
        ("whole", all_lines, lines_to_copy(script, core | optional)),
    ):
        assert named == lines, (
            f"README's copy table gives {script}'s {kind} copy {named:,} lines; it is {lines:,}"
        )


def package_index():
    """{module: {steps}} from the index in mlm_pipeline/__init__.py's docstring: lines of four
    spaces, the module's name, the steps that need it (digits), two spaces or more, what it holds;
    a description goes on in lines indented further."""
    docstring = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8")))
    entries = []
    for line in docstring.splitlines():
        if not line.startswith("    ") or line.startswith("     "):
            continue  # prose, or a description going on
        match = re.fullmatch(r"    (\w+) +([1-4](?: +[1-4])*) {2,}\S.*", line)
        assert match, f"mlm_pipeline/__init__.py's index: cannot read {line.strip()!r}"
        entries.append((match[1], set(match[2].split())))
    modules = [module for module, _ in entries]
    repeated = sorted({module for module in modules if modules.count(module) > 1})
    assert repeated == [], f"mlm_pipeline/__init__.py's index lists {repeated} more than once"
    return dict(entries)


def test_the_package_index_lists_every_module_with_the_steps_that_need_it():
    index = package_index()
    files = {path.stem for path in PACKAGE.glob("*.py")}
    assert set(index) == files, (
        f"mlm_pipeline/__init__.py's index: missing {sorted(files - set(index))}, "
        f"no such module {sorted(set(index) - files)}"
    )
    for module, steps in sorted(index.items()):
        needing = {
            step for step, script in SCRIPTS.items() if module in closure(script) | {"__init__"}
        }
        assert steps == needing, (
            f"mlm_pipeline/__init__.py's index says {module} is needed by steps "
            f"{' '.join(sorted(steps))}; the imports say {' '.join(sorted(needing)) or 'none'}"
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
