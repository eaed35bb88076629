"""Files written whole through TensorFlow's file system, local and gs:// alike: an engine module,
imported once TensorFlow may load (storage.py's checks, the front, never import it at their top).

Every file the steps hand on is written so that it is never seen half-written: one file through
`write_then_rename()` (a temporary name, then a rename: storage.write_then_rename with TensorFlow's
rename), the files a library saves through storage.staged_folder(), which uploads a gs:// folder's
files here.
"""

import os

import tensorflow as tf

from . import storage


def rename(source, target):
    """Rename a local or gs:// file, replacing `target` if it is there."""
    tf.io.gfile.rename(source, target, overwrite=True)


def write_then_rename(path):
    """storage.write_then_rename with TensorFlow's rename: the temporary name to write `path`
    under, renamed to `path` once the block ends without an error."""
    return storage.write_then_rename(path, rename)


def write_whole(path, data):
    """Write text or bytes to a file, local or gs://, that is never seen half-written."""
    mode = "wb" if isinstance(data, bytes) else "w"
    with write_then_rename(path) as temporary, tf.io.gfile.GFile(temporary, mode) as file:
        file.write(data)


def makedirs(folder):
    """Create a local or gs:// folder and its parents (nothing to do for those already there)."""
    tf.io.gfile.makedirs(folder)


def upload(source, target):
    """Copy a local file, or a folder of files, to Cloud Storage."""
    if not os.path.isdir(source):
        tf.io.gfile.copy(source, target, overwrite=True)
        return
    tf.io.gfile.makedirs(target)
    for name in sorted(os.listdir(source)):
        tf.io.gfile.copy(os.path.join(source, name), f"{target}/{name}", overwrite=True)
