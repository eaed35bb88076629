"""A Hub dataset's split, through datasets: how every step that reads one loads it (the corpus of
steps 1 and 2, the labelled task of step 4). `dataset_name` may also be a local folder laid out as
a Hub dataset repository, which datasets loads through the same code."""

from .errors import UsageError, first_line


def load_split(split, dataset_name, dataset_config, trust_remote_code=False, streaming=False):
    """A Hub dataset's split as a datasets object. Without `streaming` it is downloaded to the
    datasets cache first; with it, rows are read as they are used: nothing is copied to the cache
    and memory stays flat, whatever the corpus's size. (Files are read by corpus.file_rows.)"""
    import datasets

    try:
        # only this split's files are fetched
        extra = {"trust_remote_code": True} if trust_remote_code else {}
        return datasets.load_dataset(
            dataset_name, dataset_config, split=split, streaming=streaming, **extra
        )
    except Exception as error:
        # datasets raises many kinds; the user needs the source and the first reason
        source = f"{dataset_name}/{dataset_config}"
        raise UsageError(
            f"could not read {source}: {first_line(error)}; check the path or name."
        ) from None
