"""The Hugging Face Hub over HTTP (huggingface_hub's HfApi): no git clone, no git-lfs.

A repository is created, or found, before any work (`open_repository()`), so that a malformed id, a
missing login or an unreachable Hub stops a run in one line before it has cost anything. Every push
is one commit. train_unigram.py pushes its tokenizer and run_classifier.py its classifier once at
the end (`push_folder_files()`); run_mlm.py pushes through hub_pusher.py's `HubPusher`, in the
background while training goes on.
"""

import os

from .contract import MODEL_CARD_NAME
from .errors import UsageError, first_line

# Seconds run_mlm.py waits, at most, for the uploads of its final push (--hub_push_timeout's
# default). A base-size model with its PyTorch copy is about 1 GB, a few minutes' upload from a
# cloud VM; a large model on a slow link may take tens of minutes, and cutting a healthy upload
# costs a push by hand. An hour still bounds what a stuck upload costs: the accelerator stays
# reserved, idle, for as long as the run waits.
FINAL_PUSH_TIMEOUT = 3600


def check_hub_flags(hub_model_id, hub_private, example):
    """--hub_model_id (checked offline, as check_hub_model_id does) and --hub_private with it."""
    if hub_private and not hub_model_id:
        raise UsageError(f"--hub_private needs --hub_model_id (e.g. {example}).")
    if hub_model_id is not None:
        check_hub_model_id(hub_model_id, example)


def check_hub_model_id(repo_id, example):
    """A --hub_model_id the Hub would refuse is refused now, offline, before any work."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        reason = str(error).strip().splitlines()[0]
        raise UsageError(
            f"--hub_model_id {repo_id} is not a Hub repository id ({reason}); use namespace/name, "
            f"e.g. {example}."
        ) from None


def hub_error_text(error):
    """A Hub failure in one line: the HTTP status and the server's own words when there was a
    response.

    huggingface_hub wraps a failed file upload in an error that names the file only; its cause holds
    the reason.
    """
    cause = error
    while cause is not None and getattr(cause, "response", None) is None:
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return first_line(error)
    response = cause.response
    words = (getattr(cause, "server_message", None) or "").strip()
    return f"HTTP {response.status_code} {response.reason}" + (
        f": {words.splitlines()[0]}" if words else ""
    )


def open_repository(repo_id, private, leave_out):
    """Create the repository, or find it; returns its full id (a bare name gets the token owner's
    namespace).

    `leave_out` names the flag that asked for the push, for the message when there is no token.
    """
    from huggingface_hub import HfApi, get_token

    if get_token() is None:
        raise UsageError(
            f"--hub_model_id {repo_id} needs a Hub token with write access: run `hf auth login` or "
            f"set HF_TOKEN, or leave out {leave_out}."
        )
    try:
        # private=None leaves an existing repository as it is and lets the
        # namespace's default decide.
        repository = HfApi().create_repo(repo_id, private=private or None, exist_ok=True)
    # HTTP errors, no network, offline mode: all mean no push is possible
    except Exception as error:
        raise UsageError(
            f"could not create or find the Hub repository --hub_model_id {repo_id} "
            f"({hub_error_text(error)}); check the id, that your token may write to its namespace "
            "(`hf auth whoami`), and the network."
        ) from None
    return repository.repo_id


def push_folder_files(repo_id, folder, names, card_text, message, what="the files"):
    """One commit: the files `names` of the local `folder`, and `card_text` as the repository's
    README.md.

    A failure is one line that says `what` is safe in `folder` and how to push it later.
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    operations = [CommitOperationAdd(name, os.path.join(folder, name)) for name in names]
    operations.append(
        CommitOperationAdd(path_in_repo=MODEL_CARD_NAME, path_or_fileobj=card_text.encode("utf-8"))
    )
    try:
        return HfApi().create_commit(repo_id, operations, commit_message=message)
    except Exception as error:
        # Any failure (network, credentials, permissions) is the same line: the local copy is
        # complete anyway.
        raise UsageError(
            f"{what} is saved in {folder}, but pushing it to --hub_model_id {repo_id} failed "
            f"({hub_error_text(error)}); push that folder later with `hf upload {repo_id} "
            f"{folder}`."
        ) from None
