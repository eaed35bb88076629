"""The two TPU sets agree with each other, with the pipeline's other sets, with the libtpu check of
mlm_pipeline/tpu_runtime.py and with the install lines README prints, offline.

requirements-tpu.txt (TensorFlow 2.19.1, from PyPI) is the set tested here;
requirements-tpu-google.txt (TensorFlow 2.18.0, its libtpu on Google's wheel index only) cannot be
installed where only PyPI is reachable, so what can break in it without a run is checked here: its
pins against each other and against the tested set. tests/test_requirements.py checks both against
their packages' requirements, on the package index.
"""

import re

import pytest
from helpers import REPO
from packaging.version import Version
from test_requirements import PYTHONS, pins

from mlm_pipeline import tpu_runtime

TESTED = "requirements-tpu.txt"
GOOGLE = "requirements-tpu-google.txt"
GOOGLE_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
# What TensorFlow's TPU build 2.18 asks for that 2.19.1's set pins otherwise (each line's comment in
# requirements-tpu-google.txt says which requirement), and protobuf, below 4 for cloud-tpu-client's
# google-api-core 1.x.
DIFFERENT_IN_GOOGLES_SET = {
    "tensorflow-tpu",
    "libtpu",
    "tf-keras",
    "tensorboard",
    "numpy",
    "ml-dtypes",
    "protobuf",
}
# The pipeline's own stack, the same in every set the scripts run on.
PIPELINE = ("transformers", "tokenizers", "datasets", "huggingface-hub", "zstandard")


def version_of(name, package, python):
    return pins(name, python)[package][0]


def release_line(version):
    """'2.19' of 2.19.1: TensorFlow, tf_keras and tensorboard release together."""
    return Version(version).release[:2]


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("name", [TESTED, GOOGLE])
def test_each_tpu_set_pins_the_libtpu_the_runtime_checks_for(name, python):
    tensorflow = version_of(name, "tensorflow-tpu", python)
    assert tpu_runtime.PINNED_LIBTPU.get(tensorflow) == version_of(name, "libtpu", python), (
        f"{name} pins tensorflow_tpu {tensorflow} with libtpu "
        f"{version_of(name, 'libtpu', python)}; tpu_runtime.PINNED_LIBTPU says "
        f"{tpu_runtime.PINNED_LIBTPU.get(tensorflow)}"
    )


def test_the_runtime_knows_no_pair_that_no_set_installs():
    installed = {
        version_of(name, "tensorflow-tpu", python)
        for name in (TESTED, GOOGLE)
        for python in PYTHONS
    }
    assert set(tpu_runtime.PINNED_LIBTPU) == installed


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("name", [TESTED, GOOGLE])
def test_tensorflow_its_keras_and_tensorboard_are_one_release(name, python):
    lines = {
        package: release_line(version_of(name, package, python))
        for package in ("tensorflow-tpu", "tf-keras", "tensorboard")
    }
    assert len(set(lines.values())) == 1, f"{name} on Python {python}: {lines}"


@pytest.mark.parametrize("python", PYTHONS)
def test_googles_set_is_the_tested_set_but_where_tensorflow_2_18_asks(python):
    tested, google = pins(TESTED, python), pins(GOOGLE, python)
    assert release_line(google["tensorflow-tpu"][0]) == (2, 18)
    missing = set(tested) - set(google)
    assert not missing, f"{GOOGLE} lacks what {TESTED} installs on Python {python}: {missing}"
    different = {key for key in tested if tested[key] != google[key]}
    assert different == DIFFERENT_IN_GOOGLES_SET, (
        f"Python {python}: pinned otherwise in {GOOGLE}: {sorted(different)}; expected "
        f"{sorted(DIFFERENT_IN_GOOGLES_SET)}"
    )
    # the Cloud TPU client, with which TPUClusterResolver finds a pod slice's hosts by name
    assert "cloud-tpu-client" in google


@pytest.mark.parametrize("python", PYTHONS)
def test_the_pipelines_stack_is_the_same_in_every_set(python):
    sets = ("requirements.txt", TESTED, GOOGLE)
    for package in PIPELINE:
        versions = {name: version_of(name, package, python) for name in sets}
        assert len(set(versions.values())) == 1, f"{package} on Python {python}: {versions}"


def install_lines(text):
    """The `pip install` commands a text prints (in code blocks, tables or comments), one a line."""
    return [match.strip(" `") for match in re.findall(r"pip install [^`\n|#]*", text)]


def test_every_set_readme_installs_exists():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    named = {
        word
        for line in install_lines(readme)
        for word in line.split()
        if word.startswith("requirements") and word.endswith(".txt")
    }
    assert {TESTED, GOOGLE} <= named, named
    missing = [name for name in sorted(named) if not (REPO / name).is_file()]
    assert not missing, f"README installs sets that do not exist: {missing}"


def test_readme_installs_each_tpu_set_as_its_file_says():
    """--no-deps for both (tf_keras asks for `tensorflow`); Google's index for the 2.18 set, whose
    libtpu only it carries, and the same line in README as in the file's header."""
    readme = install_lines((REPO / "README.md").read_text(encoding="utf-8"))
    for name in (TESTED, GOOGLE):
        text = (REPO / name).read_text(encoding="utf-8")
        header = [line for line in install_lines(text) if name in line.split()]
        assert header, f"{name}'s header gives no install line"
        for line in header + [line for line in readme if name in line.split()]:
            assert "--no-deps" in line.split(), f"{line!r} installs {name} with its dependencies"
            assert (GOOGLE_INDEX in line.split()) == (name == GOOGLE), line
        assert set(header) <= set(readme), f"README does not print {name}'s own line: {header}"
