"""The look-up storage.check_gcs_paths() runs in a short-lived child process, before any work:

    python -m mlm_pipeline.gcs_probe PREFIX r:PATH w:PATH ...

Each PATH is looked up in turn; one marked "w:" (an output) also has a small object written under it
and deleted again. The first path that fails is reported as one line of JSON on stdout (path, step:
read, create or delete, error: TensorFlow's error type or NoSuchBucket, message, left: the object a
failed delete left behind) and the probe stops there; nothing printed means every path answered.

The child process exists for its environment: storage.GCS_PROBE_ENV's few quick retries and short
timeouts, which TensorFlow reads once per process, so the run that started it keeps the defaults.
Only that child imports this module (storage.py names it, GCS_PROBE_MODULE), so TensorFlow is
imported at the top.
"""

import json
import sys
import uuid

import tensorflow as tf

from .storage import bucket_of


def first_failure(paths, probe_prefix):
    """The report of the first of `paths` ("r:PATH" or "w:PATH") that TensorFlow cannot look up, or
    whose bucket does not exist (TensorFlow's makedirs() asks about a missing bucket again and
    again, without end), or, for an output ("w:"), under which a small object cannot be written or
    deleted; None if every path answered.

    The object's name is `probe_prefix` and a unique suffix (several workers of one run probe the
    same prefix at once), and it is deleted at once: a checkpoint rotation and every rewritten log
    need delete as much as create. Reading a bucket's own metadata takes a right that reading and
    writing its objects does not: if that is refused, the bucket is taken to exist."""
    for mode, path in (argument.split(":", 1) for argument in paths):
        try:
            tf.io.gfile.exists(path)
        except tf.errors.OpError as error:
            return report(path, "read", type(error).__name__, str(error))
        bucket = bucket_of(path)
        try:
            if not tf.io.gfile.exists(bucket):
                return report(path, "read", "NoSuchBucket", bucket)
        except tf.errors.OpError:
            pass
        if mode != "w":
            continue
        probe = path.rstrip("/") + "/" + probe_prefix + uuid.uuid4().hex
        try:
            # uploaded on close: an error must surface here, not in __del__
            with tf.io.gfile.GFile(probe, "w") as file:
                file.write("write check")
        except tf.errors.OpError as error:
            return report(path, "create", type(error).__name__, str(error))
        try:
            tf.io.gfile.remove(probe)
        except tf.errors.OpError as error:
            return report(path, "delete", type(error).__name__, str(error), probe)
    return None


def report(path, step, error, message, left=None):
    """What failed, as storage.probe_failure() reads it."""
    return {"path": path, "step": step, "error": error, "message": message, "left": left}


def main(argv):
    """argv: the probe object's prefix, then the paths ("r:PATH" or "w:PATH")."""
    failure = first_failure(argv[1:], argv[0])
    if failure is not None:
        print(json.dumps(failure))


if __name__ == "__main__":
    main(sys.argv[1:])
