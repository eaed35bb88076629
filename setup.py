"""What Apache Beam's remote workers install to run prepare_tfrecord_shards.py --runner
DataflowRunner (or any runner whose workers are other machines): this repository's mlm_pipeline
package, 🤗 tokenizers and google-crc32c, pinned as in requirements.txt and requirements-beam.txt
so that shards do not depend on which machine wrote them.

    python prepare_tfrecord_shards.py ... --runner DataflowRunner --setup_file ./setup.py

Beam's worker image already holds apache-beam[gcp] (numpy with it); the workers need no TensorFlow
and no transformers: they encode the records with numpy and frame them with google-crc32c
(mlm_pipeline/packing.py). The launcher, the machine you type on, runs from `pip install -r
requirements-beam.txt`.
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
