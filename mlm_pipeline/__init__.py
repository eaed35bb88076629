"""The production plumbing of the pretraining scripts: what makes a run survive the real world.

The three scripts beside this folder tell the story of each step (data, masking, model, optimizer,
fit, save); the modules here hold what a long run on a TPU VM also needs, one concern each, each
readable on its own. Scripts import these modules; nothing here imports a script.

    errors          one-line errors: UsageError, the argparse parser and types, how a script exits
    tf_startup      TensorFlow's start-up log, held back unless start-up fails
    storage         local or gs:// output folders, checked before any work (a short-lived probe)
    contract        the files the steps hand on: names, manifest keys, the record feature
    corpus          local or gs:// files (globs too) or a Hub dataset (streamed or not) as texts
    packing         the bytes of the shards: tokenize, pack, tf.train.Example records, TFRecords
    split_manifest  a finished split's manifest.json, built from what each block gave
    split_folder    a split's folder while it is written: checks, clean-up, its manifest last
    beam_pipeline   the step on Apache Beam: the pipeline graph and what its workers run
    beam_launcher   prepare_tfrecord_shards.py --runner: Beam's checks before any work, the
                    runner, the run and its errors
    hosts           the TPU connected, or the strategy without one; on several hosts, who
                    writes and which shard files each host's input pipeline reads
    model_config    the architecture from --pretrained_model_config and --config_overrides
    output_folder   run_mlm.py's output folder: refused early, started afresh, or resumed
    checkpoints     checkpoints saved during fit() and restored on resume
    segments        optimizer steps counted through epochs and fit() calls of fixed shape
    training_run    what a run does around fit(): chief and workers, resume, callbacks, the end
    model_folder    the finished model folder, published so that it never looks finished early
    metrics         the accuracy metrics, over the masked positions only
    training_logs   TensorBoard scalars, the CSV log, the curves PNG, the summary line
    pytorch_export  the PyTorch copy of a TF masked LM, written without torch, for transformers 5
    model_card      the README.md cards of the model and the tokenizer
    hub             Hub repositories and pushes over HTTP, in the background during training

To copy a step into your own project, copy its script and this folder.
"""
