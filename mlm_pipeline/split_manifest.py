"""prepare_tfrecord_shards.py on several machines: the workers' flags, their parts, and --merge.

A split is packed block by block (--rows_per_block rows each), so N workers can share it: worker i writes
blocks i, i+N, i+2N, ... and then a part, `manifest-<i>-of-<N>.json` (`contract.part_name`), listing what its
blocks gave. Once every part is written, one `--merge` checks that they are all there and agree, writes the
split's manifest.json from them and removes them. A single run is worker 0 of 1 and writes manifest.json
itself from its one part (`split_manifest`), so the files come out byte for byte the same however many
workers wrote them. How the split's folder is checked, cleared and written safely is in split_folder.
"""

import hashlib
import json

from . import contract
from .contract import FEATURE_NAME, MANIFEST_NAME, part_name
from .errors import UsageError
from .split_folder import first_difference, read_parts, remove_if_present, worker_of, write_manifest

MERGE_COMMAND = "python prepare_tfrecord_shards.py --merge --num_workers {workers} --split {split} --output_dir {out}"


def check_worker_flags(num_workers, worker_index, merge):
    """The worker index this run writes as (0 for a single run); refuses flags that do not go together."""
    if merge:
        if worker_index is not None:
            raise UsageError(
                f"--merge and --worker_index {worker_index} do not go together: run each worker with its "
                "--worker_index, then --merge once without one."
            )
        if num_workers == 1:
            raise UsageError(
                "--merge needs --num_workers N, the number of workers whose parts it merges "
                "(a run without --num_workers writes manifest.json itself)."
            )
        return None
    if num_workers > 1 and worker_index is None:
        raise UsageError(
            f"--num_workers {num_workers} needs --worker_index: run the command once per worker with "
            f"--worker_index 0 to {num_workers - 1}, then once with --merge."
        )
    if worker_index is None:
        return 0  # a single run is worker 0 of 1: the same code writes the same blocks
    if not 0 <= worker_index < num_workers:
        raise UsageError(
            f"--worker_index {worker_index} is outside 0 to {num_workers - 1} for --num_workers {num_workers}; "
            "workers are numbered from 0, and each needs --num_workers, the number of workers."
        )
    return worker_index


def block_count(rows, rows_per_block):
    return -(-rows // rows_per_block)


def run_settings(args, tokenizer, source):
    """Everything that decides the bytes of the shards, which the workers of one split must agree on. The
    tokenizer's fingerprint catches a different tokenizer under the same path or Hub id on another machine.
    (--num_proc and --batch_size change nothing in the output, so each machine may choose its own.)"""
    fingerprint = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:16]
    special = ("cls", "sep", "pad", "unk", "mask", "bos", "eos")
    return {
        "split": args.split,
        "source": source,
        "text_column": args.text_column,
        "limit": args.limit,
        "tokenizer": args.tokenizer_name_or_path,
        "tokenizer_fingerprint": fingerprint,
        "vocab_size": len(tokenizer),
        "special_token_ids": {name: getattr(tokenizer, f"{name}_token_id") for name in special},
        "max_length": args.max_length,
        "rows_per_block": args.rows_per_block,
        "shard_size": args.shard_size,
        "num_workers": args.num_workers,
    }


# ---------------------------------------------------------------------------------------------------------
# Parts and the split's manifest


def part_manifest(worker_index, settings, rows, blocks):
    """A worker's part: its settings, the split's row count as it read it, and what each of its blocks gave."""
    return {"worker_index": worker_index, "settings": settings, "rows": rows, "blocks": blocks}


def split_manifest(parts, packing):
    """The split's manifest from the parts of all its workers (a single run has one): the blocks in order, and the
    shards of each in order, so it comes out the same however many workers wrote them. `packing` says in words
    how the sequences were cut."""
    settings = parts[0]["settings"]
    blocks = sorted((block for part in parts for block in part["blocks"]), key=lambda block: block["block"])
    shards = [shard for block in blocks for shard in block["shards"]]
    documents = sum(block["documents"] for block in blocks)
    dropped_tokens = sum(block["dropped_tokens"] for block in blocks)
    records = sum(shard["records"] for shard in shards)
    check_enough_text(settings, documents, records, dropped_tokens, len(blocks))
    max_length = settings["max_length"]
    return {
        "split": settings["split"],
        "max_length": max_length,
        "records": records,
        "tokens": records * max_length,
        "dropped_tokens": dropped_tokens,
        "documents": documents,
        "rows": parts[0]["rows"],
        "rows_per_block": settings["rows_per_block"],
        "blocks": len(blocks),
        "packing": packing,
        "vocab_size": settings["vocab_size"],
        "special_token_ids": settings["special_token_ids"],
        "tokenizer": settings["tokenizer"],
        "source": settings["source"],
        "features": {FEATURE_NAME: {"dtype": "int64", "shape": [max_length]}},
        "shards": shards,
    }


def check_enough_text(settings, documents, records, dropped_tokens, blocks):
    split, source, max_length = settings["split"], settings["source"], settings["max_length"]
    if documents == 0:
        raise UsageError(f"the {split} split ({source}) has no non-blank text; check the input and --text_column.")
    if records == 0 and blocks == 1:
        raise UsageError(
            f"the {split} split ({source}) has {dropped_tokens} tokens, fewer than one sequence of --max_length "
            f"{max_length}; use more text or a smaller --max_length."
        )
    if records == 0:
        raise UsageError(
            f"the {split} split ({source}) has {dropped_tokens} tokens, but none of its {blocks} blocks of "
            f"--rows_per_block {settings['rows_per_block']} rows fills one sequence of --max_length {max_length}; "
            "use a larger --rows_per_block, more text or a smaller --max_length."
        )


def report(result, split_dir, output_dir):
    """What a run prints at its end: the split's manifest it wrote, or a worker's part and the merge to run next."""
    if "worker_index" not in result:  # a single run's manifest
        at_block_ends = f" at the ends of {result['blocks']} blocks" if result["blocks"] > 1 else ""
        print(
            f"Wrote {result['records']} sequences of {result['max_length']} tokens ({result['tokens']} tokens, "
            f"{result['dropped_tokens']} dropped{at_block_ends}) in {len(result['shards'])} shards to {split_dir}"
        )
        return
    part = result
    settings, index = part["settings"], part["worker_index"]
    workers, rows_per_block = settings["num_workers"], settings["rows_per_block"]
    total_blocks = block_count(part["rows"], rows_per_block)
    shards = [shard for block in part["blocks"] for shard in block["shards"]]
    records = sum(shard["records"] for shard in shards)
    print(
        f"Wrote the part of worker {index} of {workers} to {split_dir}: {records} sequences of "
        f"{settings['max_length']} tokens in {len(shards)} shards, from {len(part['blocks'])} of the split's "
        f"{total_blocks} blocks"
    )
    if not part["blocks"]:
        print(
            f"Worker {index} got no block: {part['rows']} rows make {total_blocks} blocks of --rows_per_block "
            f"{rows_per_block}; a smaller --rows_per_block spreads a split over more workers."
        )
    merge = MERGE_COMMAND.format(workers=workers, split=settings["split"], out=output_dir)
    print(f"Once all {workers} workers are done: {merge}")


# ---------------------------------------------------------------------------------------------------------
# --merge


def merge_parts(output_dir, split, num_workers, overwrite, packing):
    """--merge: check that the N parts are all there and agree, write manifest.json from them, then remove them."""
    import tensorflow as tf

    split_dir = contract.split_dir(output_dir, split)
    names = [part_name(index, num_workers) for index in range(num_workers)]
    found = read_parts(split_dir)
    if tf.io.gfile.exists(f"{split_dir}/{MANIFEST_NAME}") and not overwrite:
        return finish_earlier_merge(split_dir, split, found)
    check_all_parts_present(split_dir, names, found)
    parts = [found[name] for name in names]
    check_parts_agree(split_dir, parts)
    manifest = split_manifest(parts, packing)
    check_shard_files(split_dir, parts, manifest)
    write_manifest(split_dir, MANIFEST_NAME, manifest)
    for name in names:  # the manifest now says the split is finished: the parts have served
        remove_if_present(f"{split_dir}/{name}")
    print(
        f"Merged {num_workers} parts into {split_dir}/{MANIFEST_NAME}: {manifest['records']} sequences of "
        f"{manifest['max_length']} tokens in {len(manifest['shards'])} shards from {manifest['blocks']} blocks"
    )
    return manifest


def finish_earlier_merge(split_dir, split, found):
    """The split is merged already. Parts still beside its manifest (a merge killed while removing them) are
    removed when every shard they list is in the manifest; anything else is refused."""
    import tensorflow as tf

    if not found:
        raise UsageError(
            f"{split_dir} already holds a finished {split} split and no parts: there is nothing to merge "
            "(to write it again, run the workers with --overwrite_output_dir, then --merge)."
        )
    with tf.io.gfile.GFile(f"{split_dir}/{MANIFEST_NAME}") as file:
        listed = {shard["file"] for shard in json.load(file)["shards"]}
    for name, part in found.items():
        if part is None or not {shard["file"] for block in part["blocks"] for shard in block["shards"]} <= listed:
            raise UsageError(
                f"{split_dir} holds a finished {split} split and {name}, which is no part of it; remove "
                f"{name}, or pass --overwrite_output_dir to merge the parts into a new {MANIFEST_NAME}."
            )
    for name in found:
        remove_if_present(f"{split_dir}/{name}")
    print(f"{split_dir} was merged already; removed the {len(found)} parts left beside its {MANIFEST_NAME}")


def describe_workers(indices):
    """[1] -> "worker 1"; [1, 3, 5] -> "workers 1, 3 and 5"."""
    if len(indices) == 1:
        return f"worker {indices[0]}"
    return f"workers {', '.join(map(str, indices[:-1]))} and {indices[-1]}"


def check_all_parts_present(split_dir, names, found):
    workers = len(names)
    missing = [index for index, name in enumerate(names) if name not in found]
    others = [name for name in found if name not in names]
    if others and len(missing) == workers:
        their_workers = int(others[0].split("-of-")[1].split(".")[0])
        raise UsageError(
            f"{split_dir} holds no part of a run with --num_workers {workers}, but {others[0]}, a part of a run "
            f"with --num_workers {their_workers}; pass --num_workers {their_workers}."
        )
    if len(missing) == workers:
        raise UsageError(
            f"{split_dir} holds no parts to merge (no {names[0]} to {names[-1]}); run the {workers} workers first, "
            f"each with --num_workers {workers} and its --worker_index, 0 to {workers - 1}, then --merge again."
        )
    if missing:
        raise UsageError(
            f"{split_dir} lacks the part of {describe_workers(missing)} of {workers} ({names[missing[0]]} not "
            f"found); run the workers' command with --worker_index {' and '.join(map(str, missing))}, then --merge "
            "again."
        )
    if others:
        raise UsageError(
            f"{split_dir} holds {others[0]}, a part of another run, beside the {workers} parts to merge; remove it, "
            "or rerun the workers with --overwrite_output_dir."
        )


def check_parts_agree(split_dir, parts):
    """The parts come from one command run by every worker: same settings, the same split read, and each
    holding exactly the blocks its worker packs."""
    workers = len(parts)
    for index, part in enumerate(parts):
        if part is None:
            raise UsageError(
                f"{split_dir}/{part_name(index, workers)} is not a part this script can read; rerun worker {index} "
                "with --overwrite_output_dir, then --merge again."
            )
    first = parts[0]
    rerun = "with the same flags as the others and --overwrite_output_dir, then --merge again"
    for index, part in enumerate(parts[1:], start=1):
        if part["settings"] != first["settings"]:
            key, theirs, ours = first_difference(part["settings"], first["settings"])
            raise UsageError(
                f"the parts in {split_dir} disagree: worker {index} wrote with {key} {theirs}, worker 0 with {ours}; "
                f"rerun worker {index} {rerun}."
            )
        if part["rows"] != first["rows"]:
            raise UsageError(
                f"the parts in {split_dir} disagree: worker {index} read {part['rows']} rows of "
                f"{first['settings']['source']}, worker 0 read {first['rows']}, but all must read the same input; "
                f"rerun worker {index} {rerun}."
            )
    total_blocks = block_count(first["rows"], first["settings"]["rows_per_block"])
    for index, part in enumerate(parts):
        if [block["block"] for block in part["blocks"]] != list(range(index, total_blocks, workers)):
            raise UsageError(
                f"{split_dir}/{part_name(index, workers)} does not hold the blocks of worker {index} of {workers}; "
                f"rerun worker {index} with --overwrite_output_dir, then --merge again."
            )


def check_shard_files(split_dir, parts, manifest):
    """Every shard a part lists is there, and no other: the folder then holds exactly what a single run writes.
    (Their sizes are checked before training by contract.check_shards, one stat() each; here one listing does.)"""
    import tensorflow as tf

    present = {path.rsplit("/", 1)[-1] for path in tf.io.gfile.glob(f"{split_dir}/*.tfrecord")}
    for index, part in enumerate(parts):
        for shard in (shard for block in part["blocks"] for shard in block["shards"]):
            if shard["file"] not in present:
                raise UsageError(
                    f"{split_dir}/{shard['file']}, listed in the part of worker {index}, is missing; rerun worker "
                    f"{index} with --overwrite_output_dir, then --merge again."
                )
    unlisted = sorted(present - {shard["file"] for shard in manifest["shards"]})
    if unlisted:
        owner = worker_of(unlisted[0], len(parts))
        raise UsageError(
            f"{split_dir} holds {unlisted[0]}{f' and {len(unlisted) - 1} more' if len(unlisted) > 1 else ''}, "
            f"which no part lists; rerun worker {owner} with --overwrite_output_dir (it clears its blocks' old "
            "files), then --merge again."
        )
