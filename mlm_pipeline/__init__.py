"""The production plumbing of the pretraining scripts: what makes a run survive the real world.

The three scripts beside this folder tell the story of each step (data, masking, model, optimizer,
fit, save); the modules here hold what a long run on a TPU VM also needs, one concern each, each
readable on its own. Scripts import these modules; nothing here imports a script.

    errors          one-line errors: UsageError, the argparse parser and types, how a script exits
    tf_startup      TensorFlow's start-up log, held back unless start-up fails
    storage         local or gs:// output folders, checked before any work (a short-lived Cloud Storage probe)
    contract        the files the steps hand on: names, manifest keys, the record feature; reading them back
    corpus          reading local or gs:// files (globs too) or a Hub dataset (streamed, or not) as texts
    packing         the bytes of the shards: tokenize, pack, tf.train.Example records, TFRecord files
    split_manifest  a finished split's manifest.json, built from what each block gave
    split_folder    a split's folder while it is written: checks, clean-up, the manifest written last
    beam_pipeline   prepare_tfrecord_shards.py --runner: the step as an Apache Beam pipeline (Dataflow)
    hosts           run_mlm.py on several hosts: which process writes, which shards each host reads
    checkpoints     run_mlm.py's output folder, checkpoints and resume, the fit() segments and callbacks
    model_folder    run_mlm.py's finished model folder, written so that it never looks finished early
    training_logs   the accuracy metrics, TensorBoard scalars, the CSV log, the curves PNG, the summary line
    pytorch_export  the PyTorch copy of a TF masked LM, written without torch, for transformers 5
    model_card      the README.md cards of the model and the tokenizer
    hub             Hub repositories and pushes over HTTP, in the background during training

To copy a step into your own project, copy its script and this folder.
"""
