"""run_mlm.py's data when it is more than one folder, checked as the command line is read: a
mixture of training folders (--train_dataset A B, drawn by --train_weights or --mixture_alpha) and
several named validation sets (--eval_dataset NAME=PATH ...). Part of the front: no TensorFlow.

ModernBERT, Ettin and mmBERT were trained on mixtures of sources drawn by weight, and continued
models are watched on several validation sets (the domain's beside the original one): what it
learns and what it forgets.
"""

import dataclasses
import re

from .errors import UsageError

# A validation set's name becomes part of its logged names (val_<name>_loss): letters, digits,
# "_", "-" and "." only, so that it reads the same in TensorBoard, a CSV header and a file name.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_mixture_flags(folders, weights, alpha):
    """The mixture's flags agree: a weight a folder, no folder twice."""
    if weights is not None and len(weights) != len(folders):
        raise UsageError(
            f"--train_weights {' '.join(f'{w:g}' for w in weights)} gives {len(weights)} "
            f"weight(s) for {len(folders)} --train_dataset folder(s); give one weight a folder, in "
            "the folders' order."
        )
    repeated = sorted({folder for folder in folders if folders.count(folder) > 1})
    if repeated:
        raise UsageError(
            f"--train_dataset names {repeated[0]} more than once; name each folder once and weigh "
            "it with --train_weights."
        )


@dataclasses.dataclass(frozen=True)
class EvaluationSet:
    """One --eval_dataset folder: `name`, what its logs are called (NAME=PATH's NAME, else the
    folder's own name), and its `path`."""

    name: str
    path: str


def evaluation_sets(eval_dataset):
    """The EvaluationSets of --eval_dataset (each PATH or NAME=PATH), in order; [] without it.
    A PATH may hold "=" itself (gs://bucket/lang=fr): only a plain name before the first "=" names
    the set. Two sets of one name are refused: their logs would be one."""
    sets = []
    for given in eval_dataset or ():
        name, separator, path = given.partition("=")
        if not (separator and NAME_PATTERN.fullmatch(name) and path):
            name, path = folder_name(given), given
        sets.append(EvaluationSet(name, path))
    names = [one.name for one in sets]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if len(sets) > 1 and repeated:
        raise UsageError(
            f"--eval_dataset has two sets named {repeated[0]}; name each one, e.g. "
            f"--eval_dataset general={sets[0].path} domain={sets[1].path}."
        )
    return sets


def folder_name(path):
    """A validation set's name from its folder: the last part of its path, when it is a plain name
    (else "eval")."""
    last = path.rstrip("/").rsplit("/", 1)[-1]
    return last if NAME_PATTERN.fullmatch(last) else "eval"


def paths_given(train_dataset, eval_dataset):
    """{flag: path} of every --train_dataset and --eval_dataset folder, for the checks that name a
    path with its flag (storage, tpu_slice): the first folder of each flag under the flag itself, as
    with one folder; each later one with its place (train) or its name (evaluation)."""
    paths = {"--train_dataset": train_dataset[0]}
    for number, folder in enumerate(train_dataset[1:], start=2):
        paths[f"--train_dataset (folder {number})"] = folder
    sets = evaluation_sets(eval_dataset)
    paths["--eval_dataset"] = sets[0].path if sets else None
    for evaluation_set in sets[1:]:
        paths[f"--eval_dataset ({evaluation_set.name})"] = evaluation_set.path
    return paths


# A source drawn more often than this many passes over its folder is named as repeated: mmBERT
# reports its epochs per language, and past about four passes repeated text gains a model less
# than new text would.
REPEATED_PASSES = 4


@dataclasses.dataclass(frozen=True)
class Mixture:
    """The training folders of a mixture, in --train_dataset's order: each `folders`[i], its
    manifest `manifests`[i] (shard_checks.read_manifest's) and the probability `weights`[i] that a
    sequence is drawn from it (normalised: they sum to 1)."""

    folders: tuple
    manifests: tuple
    weights: tuple

    @property
    def records(self):
        """Each folder's sequences, as its manifest counts them."""
        return tuple(manifest["records"] for manifest in self.manifests)


def mixture_weights(records, weights=None, alpha=1.0):
    """Each folder's probability of being drawn: `weights` (--train_weights) normalised; without
    them, each folder's sequence count `records` to the power `alpha` (--mixture_alpha), normalised:
    1 draws by size (as if the folders were one), 0 every folder alike, between them flatter than by
    size (XLM-R's alpha, mmBERT's temperature)."""
    raw = weights if weights is not None else [count**alpha for count in records]
    total = sum(raw)
    return tuple(value / total for value in raw)


def expected_sequences(weights, total_sequences):
    """The sequences a run of `total_sequences` draws from each folder, in expectation."""
    return tuple(weight * total_sequences for weight in weights)


def passes(weights, records, total_sequences):
    """How many times a run of `total_sequences` goes through each folder, in expectation: its
    expected sequences over the sequences it holds."""
    drawn = expected_sequences(weights, total_sequences)
    return tuple(count / held for count, held in zip(drawn, records))


def mixture_lines(mixture, total_steps, global_batch_size):
    """The lines printed as a mixture's run starts (the log): each folder's share of the
    sequences and its passes over its folder, in expectation, and a line for each folder repeated
    more than REPEATED_PASSES times."""
    total = total_steps * global_batch_size
    drawn = expected_sequences(mixture.weights, total)
    repeats = passes(mixture.weights, mixture.records, total)
    lines = [
        f"A mixture of {len(mixture.folders)} --train_dataset folders: each of the run's "
        f"{total:,} sequences ({total_steps:,} steps x {global_batch_size:,}) is drawn from one "
        "of them at random by its weight; in expectation:"
    ]
    for folder, weight, count, held, repeat in zip(
        mixture.folders, mixture.weights, drawn, mixture.records, repeats
    ):
        lines.append(
            f"  {folder}: {weight:.1%} of the sequences, about {count:,.0f} = "
            f"{passes_text(repeat)} passes over its {held:,}"
        )
    lines += repeated_lines(mixture.folders, repeats)
    return lines


def passes_text(repeat):
    """Passes over a folder as the log and the card write them: two decimals, or two significant
    digits below 0.01 (a short run over a large folder), so that no share reads as none."""
    return f"{repeat:.2f}" if repeat >= 0.01 else f"{repeat:.2g}"


def repeated_lines(folders, repeats):
    """A line for each folder the run goes through more than REPEATED_PASSES times."""
    return [
        f"{folder} is repeated {repeat:.1f} times, more than {REPEATED_PASSES}: repeated text "
        "teaches less than new text; lower its weight or give it more text."
        for folder, repeat in zip(folders, repeats)
        if repeat > REPEATED_PASSES
    ]
