import csv
import json
import random
import re
import shutil
import unicodedata
from pathlib import Path

import pytest
from helpers import (
    VOCAB_SIZE,
    dataset_files,
    flags,
    make_corpus_lines,
    read_lines,
    write_hub_layout,
    write_jsonl,
    write_lines,
)
from refusals import UNIGRAM, case, refused, refused_command

import train_unigram

SPECIAL_TOKENS = ["[CLS]", "<pad>", "[SEP]", "<unk>", "[MASK]"]


def train(train_file, output_dir, *extra, vocab_size=VOCAB_SIZE):
    return train_on(output_dir, "--train_file", train_file, *extra, vocab_size=vocab_size)


def load(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def test_saves_a_fast_tokenizer_with_the_special_tokens(tokenizer_dir, tokenizer):
    assert (tokenizer_dir / "tokenizer.json").is_file()
    assert (tokenizer_dir / "tokenizer_config.json").is_file()
    assert tokenizer.is_fast
    assert tokenizer.convert_ids_to_tokens(list(range(5))) == SPECIAL_TOKENS
    assert tokenizer.cls_token == "[CLS]" and tokenizer.cls_token_id == 0
    # <pad> is id 1, as in RoBERTa: TF RoBERTa numbers positions from a padding index fixed at 1.
    assert tokenizer.sep_token == "[SEP]" and tokenizer.sep_token_id == 2
    assert tokenizer.unk_token == "<unk>" and tokenizer.unk_token_id == 3
    assert tokenizer.pad_token == "<pad>" and tokenizer.pad_token_id == 1
    assert tokenizer.mask_token == "[MASK]" and tokenizer.mask_token_id == 4
    assert sorted(tokenizer.all_special_ids) == [0, 1, 2, 3, 4]
    assert len(SPECIAL_TOKENS) < len(tokenizer) <= VOCAB_SIZE
    # The special tokens appear once each: the trainer's copies and the
    # added tokens are the same ids.
    vocab = tokenizer.get_vocab()
    assert len(set(vocab.values())) == len(vocab) == len(tokenizer)


def test_encoding_wraps_text_in_cls_and_sep(tokenizer):
    ids = tokenizer("the river crossed the old city")["input_ids"]
    assert ids[0] == tokenizer.cls_token_id
    assert ids[-1] == tokenizer.sep_token_id
    assert tokenizer.cls_token_id not in ids[1:-1] and tokenizer.sep_token_id not in ids[1:-1]
    assert tokenizer.unk_token_id not in ids  # every character is in the corpus
    assert tokenizer.decode(ids, skip_special_tokens=True) == "the river crossed the old city"

    pair = tokenizer("the river", "the city")
    tokens = tokenizer.convert_ids_to_tokens(pair["input_ids"])
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2 and tokens[-1] == "[SEP]"
    assert pair["token_type_ids"][-1] == 1 and pair["token_type_ids"][0] == 0


def test_text_is_nfkc_normalized(tokenizer):
    assert tokenizer("ｔｈｅ ｒｉｖｅｒ")["input_ids"] == tokenizer("the river")["input_ids"]


def test_the_default_tokenizer_keeps_case(tokenizer):
    assert tokenizer("The river")["input_ids"] != tokenizer("the river")["input_ids"]


def test_lowercase_reads_capitals_as_lower_case_and_keeps_mask(corpus, tmp_path):
    """--lowercase puts Lowercase in the saved normalizer: capitals anywhere, in training and in
    any later use, give the ids of the lower-cased text, and no piece holds a capital. [MASK] is
    matched before normalizing, so it stays the mask, not "[mask]" spelled out."""
    tokenizer = train(corpus["train"], tmp_path / "lower", "--lowercase")
    capitalised = {piece for piece in tokenizer.get_vocab() if piece != piece.lower()}
    assert capitalised == {"[CLS]", "[SEP]", "[MASK]"}
    assert (
        tokenizer("The RIVER Crossed")["input_ids"] == tokenizer("the river crossed")["input_ids"]
    )
    assert tokenizer.unk_token_id not in tokenizer("The RIVER Crossed")["input_ids"]
    ids = tokenizer("The [MASK] of")["input_ids"]
    assert ids.count(tokenizer.mask_token_id) == 1 and len(ids) == 5
    assert tokenizer.decode(tokenizer("The City.")["input_ids"], skip_special_tokens=True) == (
        "the city."
    )


def test_split_hyphens_reads_each_part_of_a_hyphenated_word_as_a_word(tmp_path):
    """--split_hyphens puts the split in the saved normalizer: "straight-faced", and WikiText's
    "role @-@ playing", give the ids of the words with a hyphen between them, in training (no piece
    glues a hyphen to letters) and in later use; a dash ("--") and a leading minus stay as written.
    The default tokenizer, trained on the same text, keeps the hyphenated word whole."""
    rng = random.Random(0)
    parts = [
        "straight",
        "faced",
        "well",
        "made",
        "role",
        "playing",
        "self",
        "aware",
        "real",
        "time",
    ]
    lines = make_corpus_lines(300, seed=2)
    for index in range(200):
        first, second = rng.sample(parts, 2)
        hyphen = " @-@ " if index % 2 else "-"
        lines.append(f"a {first}{hyphen}{second} film -- and -3 degrees , the {second} {first} .")
    train_file = write_lines(tmp_path / "hyphens.txt", lines)
    split = train(train_file, tmp_path / "split", "--split_hyphens")
    kept = train(train_file, tmp_path / "kept")

    def ids(tokenizer, text):
        return tokenizer(text)["input_ids"]

    assert ids(split, "a straight-faced film") == ids(split, "a straight - faced film")
    assert ids(split, "a role @-@ playing film") == ids(split, "a role - playing film")
    assert ids(kept, "a straight-faced film") != ids(kept, "a straight - faced film")
    normalize = split.backend_tokenizer.normalizer.normalize_str
    assert normalize("well-made -- a film, -3 and x- y") == "well - made -- a film, -3 and x- y"
    glued = [piece for piece in split.get_vocab() if "-" in piece and any(map(str.isalpha, piece))]
    assert glued == []
    assert "▁-" in split.get_vocab()


def test_mask_absorbs_the_space_before_it(tokenizer):
    # A word that is a single piece, so "the <word> of" and "the [MASK] of"
    # should line up token for token.
    word = next(
        w
        for w in ("river", "city", "house", "stone", "water")
        if len(tokenizer.tokenize(" " + w)) == 1
    )
    with_word = tokenizer.convert_ids_to_tokens(tokenizer(f"the {word} of")["input_ids"])
    with_mask = tokenizer.convert_ids_to_tokens(tokenizer("the [MASK] of")["input_ids"])
    assert len(with_mask) == len(with_word)
    position = with_word.index("▁" + word)
    assert with_mask[position] == "[MASK]"
    assert (
        with_mask[:position] == with_word[:position]
        and with_mask[position + 1 :] == with_word[position + 1 :]
    )
    assert with_mask[position - 1] != "▁"
    assert "▁" not in with_mask


def test_decode_gives_ordinary_text_back(corpus, tokenizer):
    lines = [line for line in read_lines(corpus["validation"]) if line.strip()]
    # NFKC changes the rest
    ordinary = [line for line in lines if unicodedata.normalize("NFKC", line) == line]
    assert len(ordinary) > 50
    for line in ordinary:
        ids = tokenizer(line)["input_ids"]
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == line


def spaced_punctuation(line):
    """WikiText's style: punctuation written as a word of its own, "the city ." rather than
    "the city."."""
    return re.sub(r"\s*([.;!?])", r" \1", line)


def test_a_whole_word_is_one_token_not_a_bare_space_and_the_word(tmp_path):
    """The trainer proposes no piece that only ever ends a word, such as "▁." or "▁;" when
    punctuation is spaced out: without train_unigram's word-end examples it spells them "▁" + ".",
    and a bare "▁" was 13% of the tokens here (18% on WikiText-2)."""
    lines = [spaced_punctuation(line) for line in make_corpus_lines(420, seed=0)]
    tokenizer = train(write_lines(tmp_path / "spaced.txt", lines), tmp_path / "tokenizer")
    tokens = tokenizer.tokenize("the city ; the tower .")
    assert "▁;" in tokens and tokens[-1] == "▁." and "▁" not in tokens

    validation = [
        spaced_punctuation(line) for line in make_corpus_lines(110, seed=1) if line.strip()
    ]
    tokens = [token for line in validation for token in tokenizer.tokenize(line)]
    assert tokens.count("▁") / len(tokens) < 0.05


def test_spaces_at_either_end_are_not_tokens(tokenizer):
    assert tokenizer.tokenize("  the river  ") == tokenizer.tokenize("the river")
    assert "▁" not in tokenizer.tokenize("the river ")


def test_blank_lines_are_skipped(tmp_path):
    lines = make_corpus_lines(150, seed=7)
    with_blanks = write_lines(tmp_path / "with_blanks.txt", lines + ["", "   ", "\t"])
    without_blanks = write_lines(
        tmp_path / "without_blanks.txt", [line for line in lines if line.strip()]
    )
    assert any(not line.strip() for line in read_lines(with_blanks))

    train(with_blanks, tmp_path / "a", vocab_size=200)
    train(without_blanks, tmp_path / "b", vocab_size=200)
    assert same_tokenizer(tmp_path / "a", tmp_path / "b")


def test_windows_and_old_mac_line_ends_read_as_newlines(tmp_path):
    lines = [line for line in make_corpus_lines(150, seed=7) if line.strip()]
    unix = write_lines(tmp_path / "unix.txt", lines)
    mixed = tmp_path / "mixed.txt"
    mixed.write_bytes(
        "".join(line + ("\r\n" if index % 2 else "\r") for index, line in enumerate(lines)).encode()
    )
    train(unix, tmp_path / "unix", vocab_size=200)
    train(mixed, tmp_path / "mixed", vocab_size=200)
    assert same_tokenizer(tmp_path / "unix", tmp_path / "mixed")


def test_text_that_is_not_utf8_is_a_usage_error(tmp_path):
    path = tmp_path / "latin1.txt"
    lines = make_corpus_lines(20, seed=3) + ["caf\xe9 cr\xe8me"]
    path.write_bytes("\n".join(lines).encode("latin-1"))
    line = next(number for number, text in enumerate(lines, start=1) if "\xe9" in text)
    where = rf"could not read .*latin1\.txt: it is not UTF-8 text \(line {line} holds the byte 0xe9"
    with pytest.raises(train_unigram.UsageError, match=where):
        train(path, tmp_path / "tokenizer")
    assert not (tmp_path / "tokenizer").exists()


def test_same_input_gives_byte_identical_tokenizer(corpus, tokenizer_dir, tmp_path):
    expected = (tokenizer_dir / "tokenizer.json").read_bytes()
    for run in range(3):
        train(corpus["train"], tmp_path / f"run{run}")
        assert (tmp_path / f"run{run}" / "tokenizer.json").read_bytes() == expected, (
            f"run {run} differs"
        )


@pytest.mark.parametrize("extension", [".jsonl", ".csv"])
def test_structured_input_with_text_column(corpus, tokenizer_dir, tmp_path, extension):
    lines = read_lines(corpus["train"])
    path = tmp_path / f"corpus{extension}"
    if extension == ".jsonl":
        with open(path, "w", encoding="utf-8") as file:
            for index, line in enumerate(lines):
                file.write(json.dumps({"id": index, "body": line if line else None}) + "\n")
    else:
        with open(path, "w", encoding="utf-8", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["id", "body"])
            writer.writerows(enumerate(lines))

    train(path, tmp_path / "tokenizer", "--text_column", "body")
    tokenizer = load(tmp_path / "tokenizer")
    assert tokenizer.is_fast and tokenizer.mask_token_id == 4
    # Same text as the .txt corpus, so the same tokenizer, byte for byte.
    expected = (tokenizer_dir / "tokenizer.json").read_bytes()
    assert (tmp_path / "tokenizer" / "tokenizer.json").read_bytes() == expected


def test_wrong_text_column_is_a_usage_error(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        "".join(json.dumps({"body": line}) + "\n" for line in make_corpus_lines(20, seed=3))
    )
    with pytest.raises(train_unigram.UsageError, match="'text'.*body"):
        train(path, tmp_path / "tokenizer")
    assert not (tmp_path / "tokenizer").exists()


def test_limit_uses_only_the_first_rows(corpus, tmp_path):
    lines = read_lines(corpus["train"])
    head = write_lines(tmp_path / "head.txt", lines[:100])
    train(corpus["train"], tmp_path / "limited", "--limit", 100, vocab_size=200)
    train(head, tmp_path / "head", vocab_size=200)
    assert (tmp_path / "limited" / "tokenizer.json").read_bytes() == (
        tmp_path / "head" / "tokenizer.json"
    ).read_bytes()


def test_existing_tokenizer_is_kept_unless_overwrite(corpus, tmp_path):
    output_dir = tmp_path / "tokenizer"
    small = write_lines(tmp_path / "small.txt", make_corpus_lines(60, seed=5))
    train(small, output_dir, vocab_size=100)
    before = (output_dir / "tokenizer.json").read_bytes()

    with pytest.raises(train_unigram.UsageError, match="--overwrite_output_dir"):
        train(corpus["train"], output_dir)
    assert (output_dir / "tokenizer.json").read_bytes() == before

    train(corpus["train"], output_dir, "--overwrite_output_dir")
    assert (output_dir / "tokenizer.json").read_bytes() != before
    assert len(load(output_dir)) > 100


def test_dataset_name_path_reads_the_train_split(corpus, tmp_path):
    """--dataset_name goes through load_dataset(name, config, split="train"), as a Hub id does; a
    local folder holding train.txt and validation.txt stands in for the Hub, offline."""
    dataset_dir = tmp_path / "dataset"
    dataset_dir.mkdir()
    (dataset_dir / "train.txt").write_bytes(corpus["train"].read_bytes())
    (dataset_dir / "validation.txt").write_text("zebra xylophone quokka\n" * 50, encoding="utf-8")
    source = flags(dataset_name=dataset_dir, dataset_config="default")
    from_folder = train_on(tmp_path / "from_folder", *source)
    from_file = train(corpus["train"], tmp_path / "from_file")
    assert (tmp_path / "from_folder" / "tokenizer.json").read_bytes() == (
        tmp_path / "from_file" / "tokenizer.json"
    ).read_bytes()
    assert "▁zebra" not in from_folder.get_vocab()  # the validation split was not read
    assert from_file.get_vocab() == from_folder.get_vocab()


def test_an_interrupted_save_leaves_no_finished_looking_folder(corpus, tmp_path, monkeypatch):
    output_dir = tmp_path / "tokenizer"
    real_replace, moved = train_unigram.os.replace, []

    def replace_then_die(source, target):
        if moved:  # the second file: as if the process were killed here
            raise KeyboardInterrupt
        moved.append(target)
        real_replace(source, target)

    monkeypatch.setattr(train_unigram.os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(corpus["train"], output_dir)
    assert not (output_dir / "tokenizer.json").exists()  # published last
    monkeypatch.undo()

    train(corpus["train"], output_dir)  # the same command again: no --overwrite_output_dir needed
    assert (output_dir / "tokenizer.json").is_file()
    assert sorted(path.name for path in output_dir.iterdir() if path.name.startswith(".")) == []


@pytest.mark.parametrize("name", ["wiki.train.raw", "wiki.train.tokens", "corpus"])
def test_plain_text_under_any_extension_is_read_as_text(corpus, tokenizer_dir, tmp_path, name):
    """WikiText's own files (and a file with no extension) need no renaming to .txt."""
    path = tmp_path / name
    path.write_bytes(corpus["train"].read_bytes())
    train(path, tmp_path / "tokenizer")
    assert (tmp_path / "tokenizer" / "tokenizer.json").read_bytes() == (
        tokenizer_dir / "tokenizer.json"
    ).read_bytes()


def test_an_archive_and_a_gz_file_that_is_not_gzip_are_refused_by_name(corpus, tmp_path):
    """.xz is not read (an archive format here); a .gz file is read as gzip, and one that is not
    gzip (plain text named .gz) is refused by name, not read as garbage."""
    for name, error in (
        ("train.txt.xz", r"'\.xz', an archive or document format"),
        ("train.txt.gz", r"train\.txt\.gz: BadGzipFile: Not a gzipped file"),
    ):
        path = tmp_path / name
        path.write_bytes(corpus["train"].read_bytes())
        with pytest.raises(train_unigram.UsageError, match=error):
            train(path, tmp_path / "tokenizer")
        assert not (tmp_path / "tokenizer").exists()


# Many files: a glob over local files, and a dataset read as a stream.


def train_on(output_dir, *source, vocab_size=VOCAB_SIZE):
    """train_unigram.py on any source flags (`train` is the shorthand for one --train_file)."""
    argv = [str(arg) for arg in source] + ["--vocab_size", str(vocab_size)]
    return train_unigram.main(train_unigram.parse_args(argv + ["--output_dir", str(output_dir)]))


def tokenizer_bytes(folder):
    return (Path(folder) / "tokenizer.json").read_bytes()


def same_tokenizer(folder, other):
    return tokenizer_bytes(folder) == tokenizer_bytes(other)


@pytest.mark.parametrize("extension", [".txt", ".jsonl"])
def test_a_glob_reads_its_files_one_after_another_in_sorted_order(tmp_path, capsys, extension):
    """Parts made in the order part-2, part-10, part-1 are read as part-1, part-10, part-2 (by
    name); --limit takes rows from all three, so another order would give another tokenizer."""
    lines = make_corpus_lines(420, seed=0)
    parts = {"part-2": lines[250:], "part-10": lines[100:250], "part-1": lines[:100]}
    folder = tmp_path / "corpus"
    folder.mkdir()
    write = write_lines if extension == ".txt" else write_jsonl
    files = {name: write(folder / f"{name}{extension}", part) for name, part in parts.items()}
    pattern = str(folder / f"part-*{extension}")
    train(pattern, tmp_path / "from_glob", "--limit", 300, vocab_size=200)
    assert f" on {pattern}.\n" in capsys.readouterr().out  # the pattern as given

    for order, names in (("sorted", sorted(files)), ("creation", list(files))):
        whole = tmp_path / f"{order}{extension}"  # one file: the parts' bytes end to end
        whole.write_bytes(b"".join(files[name].read_bytes() for name in names))
        train(whole, tmp_path / order, "--limit", 300, vocab_size=200)
    assert same_tokenizer(tmp_path / "from_glob", tmp_path / "sorted")
    assert not same_tokenizer(tmp_path / "from_glob", tmp_path / "creation")


def test_a_glob_that_matches_nothing_is_refused_in_one_line(tmp_path, run_script):
    (tmp_path / "corpus").mkdir()
    write_lines(tmp_path / "corpus" / "train.txt", make_corpus_lines(20, seed=3))
    pattern, output_dir = str(tmp_path / "corpus" / "part-*.txt"), tmp_path / "tokenizer"
    with pytest.raises(train_unigram.UsageError, match=f"{re.escape(pattern)} matches no file"):
        train(pattern, output_dir)

    result = run_script("train_unigram.py", "--train_file", pattern, "--output_dir", output_dir)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    refusal = (
        f"train_unigram.py: error: --train_file {pattern} matches no file; "
        "check the path and the pattern (quote it in the shell)."
    )
    assert result.stderr.strip().splitlines() == [refusal]
    assert not output_dir.exists()


def test_streaming_writes_nothing_to_the_datasets_cache(
    corpus, tokenizer_dir, datasets_cache, tmp_path
):
    lines = read_lines(corpus["train"])
    hub = write_hub_layout(tmp_path / "dataset", [lines[:200], lines[200:]])
    local = ["--train_file", tmp_path / "dataset" / "data" / "train-*.jsonl"]  # local tabular files
    for name, source in (("hub", hub), ("local", local)):
        train_on(tmp_path / name, *source, "--streaming")
        assert same_tokenizer(tmp_path / name, tokenizer_dir), f"{name}: another tokenizer"
    assert dataset_files(datasets_cache) == []

    train_on(tmp_path / "downloaded", *hub)  # without --streaming: converted into the cache first
    assert same_tokenizer(tmp_path / "downloaded", tokenizer_dir)
    assert any(path.suffix == ".arrow" for path in dataset_files(datasets_cache))


def test_streaming_with_limit_reads_only_the_first_rows(corpus, datasets_cache, tmp_path):
    """--limit 300 of a stream reads rows 0-299, across the first two parts, and never opens the
    third: not JSON at all, it fails the same run without --limit, in one line."""
    lines = read_lines(corpus["train"])
    hub = write_hub_layout(tmp_path / "dataset", [lines[:200], lines[200:], "{this is not JSON\n"])
    small = ["--batch_size", 50]  # the stream is read a batch ahead of the trainer
    train_on(tmp_path / "streamed", *hub, "--streaming", "--limit", 300, *small, vocab_size=200)
    head = write_lines(tmp_path / "head.txt", lines[:300])
    train(head, tmp_path / "head", *small, vocab_size=200)
    assert same_tokenizer(tmp_path / "streamed", tmp_path / "head")
    assert dataset_files(datasets_cache) == []

    source = re.escape(f"{hub[1]}/default")
    with pytest.raises(train_unigram.UsageError, match=f"could not read {source}: "):
        train_on(tmp_path / "whole", *hub, "--streaming", *small, vocab_size=200)
    assert not (tmp_path / "whole").exists()


# --------------------------------------------------------------------------------------------------
# Bad input, as the user meets it: train_unigram.py in a subprocess (tests/refusals.py)

BAD_FLAGS_AND_FILES = [
    case(
        "unigram: no --output_dir",
        "train_unigram.py --train_file {corpus}",
        "--output_dir",
        exit_code=2,
    ),
    case(
        "unigram: --vocab_size 32k",
        UNIGRAM + " --vocab_size 32k",
        "--vocab_size",
        "'32k'",
        exit_code=2,
    ),
    case(
        "unigram: --vocab_size 3", UNIGRAM + " --vocab_size 3", "--vocab_size 3", "special tokens"
    ),
    case(
        "unigram: --limit -3",
        UNIGRAM + " --limit -3",
        "--limit: -3 must be a positive number",
        exit_code=2,
    ),
    case(
        "unigram: --batch_size -1",
        UNIGRAM + " --batch_size -1",
        "--batch_size: -1 must be",
        exit_code=2,
    ),
    case(
        "unigram: --push_to_hub alone",
        UNIGRAM + " --push_to_hub",
        "--push_to_hub",
        "--hub_model_id",
    ),
    case(
        "unigram: missing corpus",
        UNIGRAM + " --train_file {out}.txt",
        "--train_file {out}.txt",
        "does not exist",
    ),
    case(
        "unigram: corpus is a folder",
        UNIGRAM + " --train_file {corpus_folder}",
        "{corpus_folder}",
        "folder",
    ),
    case(
        "unigram: blank corpus",
        UNIGRAM + " --train_file {blank_lines}",
        "{blank_lines}",
        "no non-blank text",
    ),
    case(
        "unigram: zero-byte corpus",
        UNIGRAM + " --train_file {zero_bytes}",
        "{zero_bytes}",
        "is empty",
    ),
    case(
        "unigram: .docx corpus",
        UNIGRAM + " --train_file {word_document}",
        "{word_document}",
        "'.docx'",
    ),
    case(
        "unigram: not UTF-8",
        UNIGRAM + " --train_file {not_utf8}",
        "{not_utf8}",
        "not UTF-8",
        "line {not_utf8_line}",
        "0xe9",
    ),
    case(
        "unigram: output under a file",
        UNIGRAM + " --output_dir {a_file}/tokenizer",
        "{a_file}/tokenizer",
        "file",
    ),
    case(
        "unigram: output is a file",
        UNIGRAM + " --output_dir {a_file}",
        "--output_dir {a_file}",
        "is a file",
    ),
]


@pytest.mark.parametrize("command, needles, exit_code", BAD_FLAGS_AND_FILES)
def test_bad_flag_or_file(run_script, bad_inputs, tmp_path, command, needles, exit_code):
    refused_command(run_script, bad_inputs, tmp_path, command, needles, exit_code)


def test_unigram_refuses_to_replace_a_tokenizer(run_script, corpus, tokenizer_dir, tmp_path):
    output_dir = tmp_path / "tokenizer"
    shutil.copytree(tokenizer_dir, output_dir)
    args = flags(train_file=corpus["validation"], vocab_size=100, output_dir=output_dir)
    refused(run_script, "train_unigram.py", args, output_dir, output_dir, "--overwrite_output_dir")
