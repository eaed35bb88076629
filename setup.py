"""What Apache Beam's remote workers install to run prepare_tfrecord_shards.py --runner
DataflowRunner (or any runner whose workers are other machines): this repository's mlm_pipeline
package and 🤗 tokenizers, pinned as in requirements.txt so that shards do not depend on which
machine wrote them.

    python prepare_tfrecord_shards.py ... --runner DataflowRunner --setup_file ./setup.py

Beam's worker image already holds apache-beam[gcp] (numpy and google-crc32c with it); the workers
need no TensorFlow and no transformers. The launcher itself runs from `pip install -r
requirements.txt`.
"""

import setuptools

setuptools.setup(
    name="mlm-pipeline",
    version="1.0.0",
    description=(
        "The plumbing of a masked-LM pretraining pipeline: what Beam's workers import to write "
        "shards."
    ),
    packages=["mlm_pipeline"],
    python_requires=">=3.10",
    install_requires=["tokenizers==0.22.2", "google-crc32c==1.9.0"],
)
