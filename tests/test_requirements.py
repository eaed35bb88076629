"""Every requirement set installs on Python 3.10 (Ubuntu 22.04: a TPU VM, a Deep Learning VM),
3.11 (CI) and 3.12 (Ubuntu 24.04, a laptop), and installs exactly what it pins.

pip answers against the package index that this machine's pip is set up for: a dry run with
--python-version for each Python (no such interpreter is needed here) and --only-binary=:all:, so
that a pin with no wheel for that Python, or whose wheel's Requires-Python excludes it, fails as it
would on the user's machine. The sets that install into one environment go into one run.

pip evaluates environment markers for the Python it runs on, not for --python-version, so its
resolver answers for the test's own Python only (there, it must pick exactly the pins). For every
Python, and for each set on its own, the test then checks from the package metadata in pip's report
that every dependency of every pinned package (its markers evaluated for that Python) is pinned in
the set, by a version that satisfies it: with every pin exact, that is what makes a fresh
`pip install -r` of the set pick exactly its pins. The TPU set is installed with --no-deps
(requirements-tpu.txt says why) and checked the same way, but for the one name tensorflow_tpu does
not claim. So is Google's TensorFlow 2.18 TPU set (requirements-tpu-google.txt), but for its libtpu,
which only Google's wheel index carries: every other pin must be on the index this machine reaches,
and every package's requirements satisfied by the set's pins, libtpu's included.

Needs the package index (CI has it); `-m smoke` does not run it, and `-m "not network"` leaves it
out.
"""

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import REPO
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

pytestmark = pytest.mark.network

PYTHONS = ("3.10", "3.11", "3.12")
# Pinned releases that the index has only as a source archive: pip's dry run for another Python
# takes wheels only, so the test builds these (pure Python) into wheels first, as pip does on the
# user's machine. apache-beam[gcp] 2.77 asks for google-apitools<0.5.32 below Python 3.13.
SDIST_ONLY = ("google-apitools",)
# What one dry run a Python resolves: sets that install into one environment go together. The TPU
# sets install with --no-deps, so theirs are not resolved, only fetched.
RESOLVED = {
    "main": ("requirements-test.txt", "requirements-gpu.txt"),
    "export": ("requirements-export-test.txt",),
    "tpu": ("requirements-test-tpu.txt",),
    "tpu-google": ("requirements-tpu-google.txt",),
}
NOT_RESOLVED = ("tpu", "tpu-google")
# Pins on Google's wheel index only (https://storage.googleapis.com/libtpu-tf-releases/index.html),
# which this machine's index does not carry: left out of the dry run, checked by their requirers.
GOOGLE_INDEX_ONLY = {"requirements-tpu-google.txt": ("libtpu",)}
# Each set, and the run whose report holds its packages.
SETS = {
    "requirements.txt": "main",
    "requirements-beam.txt": "main",
    "requirements-benchmarks.txt": "main",
    "requirements-test.txt": "main",
    "requirements-gpu.txt": "main",
    "requirements-export-test.txt": "export",
    "requirements-tpu.txt": "tpu",
    "requirements-test-tpu.txt": "tpu",
    "requirements-tpu-google.txt": "tpu-google",
}


def marker_environment(python):
    env = default_environment()
    env.update(python_version=python, python_full_version=f"{python}.0")
    return env


def read_set(name):
    """The requirement lines of a set, its -r includes followed."""
    lines = []
    for line in (REPO / name).read_text(encoding="utf-8").splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        if line.startswith("-r"):
            lines += read_set(line[2:].strip())
        elif line:
            lines.append(line)
    return lines


def applying_lines(name, python):
    """The set's lines that apply on that Python, without their markers."""
    out = []
    for line in read_set(name):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(marker_environment(python)):
            out.append(line.split(";")[0].strip())
    return out


def pins(name, python):
    """{name: (version, extras)} of what the set installs on that Python."""
    out = {}
    for line in applying_lines(name, python):
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"{name}: {line} is not pinned exactly"
        key = canonicalize_name(req.name)
        version, extras = out.get(key, (spec.version, set()))
        assert version == spec.version, f"{name}: {req.name} pinned twice on Python {python}"
        out[key] = (version, extras | req.extras)
    return out


def fetched_pins(name, python):
    """pins() of the set but for those the dry run cannot fetch (GOOGLE_INDEX_ONLY)."""
    left_out = GOOGLE_INDEX_ONLY.get(name, ())
    return {key: pin for key, pin in pins(name, python).items() if key not in left_out}


def same_version(resolved, pinned):
    # torch==2.13.0 matches the CPU build 2.13.0+cpu, which pip prefers where it is at hand.
    return Version(resolved).public == Version(pinned).public


@pytest.fixture(scope="module")
def sdist_wheels(tmp_path_factory):
    """Wheels built from the pins that the index has as source archives only."""
    folder = tmp_path_factory.mktemp("sdist_wheels")
    wanted = [
        f"{key}=={version}"
        for key, (version, _) in pins("requirements-test.txt", "3.11").items()
        if key in SDIST_ONLY
    ]
    assert len(wanted) == len(SDIST_ONLY), "a name in SDIST_ONLY is no longer pinned"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(folder)] + wanted,
        check=True,
        capture_output=True,
    )
    built = [path.name for path in folder.glob("*.whl")]
    # A wheel for one Python only would make the dry run for the others a lie.
    assert len(built) == len(wanted) and all(n.endswith("-none-any.whl") for n in built), built
    return folder


def dry_run(run, python, folder, wheels):
    """pip's dry run of one group for one Python: (return code, stderr, report or None)."""
    report = folder / f"{run}-{python}.json"
    files = RESOLVED[run]
    # pip's resolver runs for the Python it runs on only: it evaluates the dependencies' markers
    # for that one, whatever --python-version says. For the others missing_dependencies does it.
    resolve = run not in NOT_RESOLVED and python == "{}.{}".format(*sys.version_info)
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
    command += ["--only-binary=:all:", "--python-version", python, "--find-links", str(wheels)]
    # pip before 24.1 takes --python-version only with --target; a dry run writes nothing there.
    command += ["--target", str(folder / "target"), "--quiet", "--report", str(report)]
    command += ["--disable-pip-version-check", "--progress-bar", "off"]
    # Each package's metadata read from its wheel by HTTP range requests, where the index has no
    # separate metadata file: the same report without downloading every wheel whole (a TensorFlow
    # wheel for each Python), in half the CPU time. pip warns that the feature is experimental.
    command += ["--use-feature=fast-deps"]
    command += [] if resolve else ["--no-deps"]
    # pip evaluates environment markers against the Python it runs on, whatever --python-version
    # says, so it is given the lines that apply to the target Python, their markers evaluated here.
    lines = [
        line
        for name in files
        for line in applying_lines(name, python)
        if canonicalize_name(Requirement(line).name) not in GOOGLE_INDEX_ONLY.get(name, ())
    ]
    wanted = folder / f"{run}-{python}.txt"
    wanted.write_text("\n".join(lines) + "\n")
    command += ["-r", str(wanted)]
    done = subprocess.run(command, capture_output=True, text=True)
    return done.returncode, done.stderr, json.loads(report.read_text()) if report.exists() else None


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory, sdist_wheels):
    """Every dry run, side by side: they wait on the index as much as on the cores."""
    folder = tmp_path_factory.mktemp("dry_runs")
    jobs = [(run, python) for run in RESOLVED for python in PYTHONS]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {job: pool.submit(dry_run, *job, folder, sdist_wheels) for job in jobs}
        return {job: future.result() for job, future in futures.items()}


def report_packages(report):
    return {canonicalize_name(item["metadata"]["name"]): item for item in report["install"]}


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("run", sorted(RESOLVED))
def test_pip_installs_exactly_the_pins(dry_runs, run, python):
    code, stderr, report = dry_runs[run, python]
    errors = [line for line in stderr.splitlines() if not line.startswith("WARNING")]
    assert code == 0, f"pip's dry run on Python {python} failed:\n" + "\n".join(errors[-20:])
    wanted = {}
    for name in RESOLVED[run]:
        wanted.update(fetched_pins(name, python))
    got = {key: item["metadata"]["version"] for key, item in report_packages(report).items()}
    differ = {
        key: (version, got.get(key))
        for key, (version, _) in wanted.items()
        if key not in got or not same_version(got[key], version)
    }
    assert not differ, f"pinned vs what pip picks on Python {python}: {differ}"
    extra = set(got) - set(wanted)
    if run == "export":
        # torch's default build (wherever the CPU wheel is not at hand) brings CUDA's libraries,
        # as requirements-export-test.txt says; nothing else may come unpinned.
        extra -= unpinned_dependencies_of("torch", report_packages(report), wanted, python)
    assert not extra, f"pip adds packages the set does not pin on Python {python}: {extra}"


def unpinned_dependencies_of(root, packages, pinned, python):
    """Names pulled in by `root` through packages that are not pinned, followed transitively (with
    the extras asked of each, as torch asks cuda-toolkit[cublas,...])."""
    seen, todo = set(), [(root, set())]
    while todo:
        key, extras = todo.pop()
        item = packages.get(key)
        for line in item["metadata"].get("requires_dist", []) if item else []:
            req = Requirement(line)
            dep = canonicalize_name(req.name)
            if dep in pinned or dep in seen or not applies(req, extras, python):
                continue
            seen.add(dep)
            todo.append((dep, set(req.extras)))
    return seen


def applies(req, extras, python):
    """Whether a dependency applies on that Python, for a package installed with those extras."""
    if req.marker is None:
        return True
    env = marker_environment(python)
    return any(req.marker.evaluate(dict(env, extra=e)) for e in ["", *sorted(extras)])


def missing_dependencies(pinned, packages, python):
    """(who, name, why) of each dependency, with the extras asked of each package, that the pins do
    not satisfy; who is the package asking where the name is not pinned at all."""
    extras = {key: set(map(canonicalize_name, e)) for key, (_, e) in pinned.items()}
    problems, changed = [], True
    while changed:  # extras asked by one package of another (google-auth[requests]) spread
        changed, problems = False, []
        for key in pinned:
            if key not in packages:
                continue  # not fetched (GOOGLE_INDEX_ONLY): its requirers are checked against it
            requires_python = packages[key]["metadata"].get("requires_python") or ""
            if not SpecifierSet(requires_python).contains(f"{python}.0"):
                problems.append((None, key, f"{key} needs Python {requires_python}"))
            for line in packages[key]["metadata"].get("requires_dist", []):
                req = Requirement(line)
                if not applies(req, extras[key], python):
                    continue
                dep = canonicalize_name(req.name)
                if dep not in pinned:
                    problems.append((key, dep, f"{key} needs {req}"))
                    continue
                if not req.specifier.contains(pinned[dep][0], prereleases=True):
                    problems.append((None, dep, f"{key} needs {req}, pinned {pinned[dep][0]}"))
                new = set(map(canonicalize_name, req.extras)) - extras[dep]
                if new:
                    extras[dep] |= new
                    changed = True
    return problems


def may_stay_unpinned(run, who, dep):
    if run in ("tpu", "tpu-google"):
        # tf_keras asks for `tensorflow`, which tensorflow_tpu provides under another name.
        return (who, dep) == ("tf-keras", "tensorflow")
    if run == "export":
        # torch's default build asks for CUDA's libraries; its CPU build, pinned, does not.
        return who == "torch"
    return False


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("name", sorted(SETS))
def test_each_set_is_complete_on_its_own(dry_runs, name, python):
    code, _, report = dry_runs[SETS[name], python]
    if code != 0:
        pytest.skip("its dry run failed, which test_pip_installs_exactly_the_pins reports")
    pinned = pins(name, python)
    packages = report_packages(report)
    unfetched = set(pinned) - set(packages)
    assert unfetched <= set(GOOGLE_INDEX_ONLY.get(name, ())), f"not in pip's report: {unfetched}"
    problems = [
        why
        for who, dep, why in missing_dependencies(pinned, packages, python)
        if not may_stay_unpinned(SETS[name], who, dep)
    ]
    assert not problems, f"{name} on Python {python}:\n" + "\n".join(problems)
