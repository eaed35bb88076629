"""Steps 1 and 2 keep every flag users already type: each script's --help lists exactly the flags
below (an alias, such as --export_to_hub, counts as a flag of its own), each with the default below.
A flag dropped, renamed or added, or a default changed, fails here first. And they speak the --help
style of mlm_pipeline/settings.py, as run_mlm.py does: every flag's help is sentences, ending with a
full stop, followed by the default as argparse shows it.
"""

import dataclasses
import re

import pytest

import prepare_tfrecord_shards
import train_unigram

# The flags of each data script, with their defaults (None: not given; False: a switch left off).
UNIGRAM_FLAGS = {
    "--train_file": None,
    "--dataset_name": "wikitext",
    "--dataset_config": "wikitext-103-raw-v1",
    "--text_column": "text",
    "--limit": None,
    "--streaming": False,
    "--trust_remote_code": False,
    "--batch_size": 1000,
    "--vocab_size": 32000,
    "--lowercase": False,
    "--split_hyphens": False,
    "--output_dir": "OUT",  # required: the value the test passes
    "--overwrite_output_dir": False,
    "--push_to_hub": False,
    "--export_to_hub": False,  # --push_to_hub's other spelling
    "--hub_model_id": None,
    "--hub_private": False,
}
PREPARE_FLAGS = {
    "--train_file": None,
    "--validation_file": None,
    "--test_file": None,
    "--dataset_name": "wikitext",
    "--dataset_config": "wikitext-103-raw-v1",
    "--text_column": "text",
    "--limit": None,
    "--streaming": False,
    "--trust_remote_code": False,
    "--split": "train",
    "--tokenizer_name_or_path": "TOKENIZER",  # required: the value the test passes
    "--max_length": 128,
    "--batch_size": 1000,
    "--num_proc": None,
    "--output_dir": "OUT",  # required: the value the test passes
    "--shard_size": 10000,
    "--overwrite_output_dir": False,
    "--rows_per_block": 100000,
    "--runner": None,
}
SCRIPTS = {
    "train_unigram.py": (train_unigram, UNIGRAM_FLAGS, ["--output_dir", "OUT"]),
    "prepare_tfrecord_shards.py": (
        prepare_tfrecord_shards,
        PREPARE_FLAGS,
        ["--tokenizer_name_or_path", "TOKENIZER", "--output_dir", "OUT"],
    ),
}
# An option's line in --help: two spaces, then its spellings ("--a A, --b A"), maybe its help.
OPTION_LINE = re.compile(r"^  (--?\w[\w-]*(?: [A-Z_]+)?(?:, --?\w[\w-]*(?: [A-Z_]+)?)*)(?:  |$)")


def help_flags(help_text):
    """Every option spelling --help lists, -h and --help aside."""
    flags = set()
    for line in help_text.splitlines():
        match = OPTION_LINE.match(line)
        if match:
            flags |= {spelling.split(" ")[0] for spelling in match.group(1).split(", ")}
    return flags - {"-h", "--help"}


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_exactly_the_flags_users_type(run_script, script):
    result = run_script(script, "--help")
    assert result.returncode == 0, result.stderr
    assert help_flags(result.stdout) == set(SCRIPTS[script][1])


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_keeps_its_default(script):
    module, flags, required = SCRIPTS[script]
    settings = module.parse_args(required)
    values = {
        f"--{field.name}": getattr(group, field.name)
        for group in (getattr(settings, name.name) for name in dataclasses.fields(settings))
        for field in dataclasses.fields(group)
        if field.name != "beam_options"  # no flag: what Beam is handed with --runner
    }
    declared = {flag: default for flag, default in flags.items() if flag != "--export_to_hub"}
    assert values == declared


def test_the_old_spelling_of_push_to_hub_still_pushes():
    argv = ["--output_dir", "OUT", "--hub_model_id", "my-user/my-tokenizer"]
    assert train_unigram.parse_args([*argv, "--export_to_hub"]).hub.push_to_hub is True


@pytest.mark.parametrize("module", [train_unigram, prepare_tfrecord_shards])
def test_help_in_settings_style(module):
    """Each flag's help is one or more sentences with a full stop, as run_mlm.py's, and the default
    is shown after it by settings.py (argparse's "(default: ...)"), never written in by hand."""
    for group in dataclasses.fields(module.Settings):
        for field in dataclasses.fields(group.type):
            help = field.metadata.get("help")
            if help is None:  # a field without a flag of its own
                continue
            assert help[0].isupper() and help.endswith("."), f"--{field.name}: {help!r}"
            assert "default:" not in help, f"--{field.name}: {help!r}"
