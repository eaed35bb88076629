"""The production plumbing of the pipeline's scripts: what makes a run survive the real world.

The four scripts beside this folder tell the story of each step (data, masking, model, optimizer,
fit, save); the modules here hold what a long run on a TPU VM also needs, one concern each, each
readable on its own. Scripts import these modules; nothing here imports a script.

The index below names every module once: the steps that need it (1 train_unigram.py,
2 prepare_tfrecord_shards.py, 3 run_mlm.py, 4 run_classifier.py: the script's imports, followed
through the package), then what it holds. To use a step in your own project, copy its script and
the modules README.md's table "What to copy for each step" names for it, the ones marked here with
its number, into a folder mlm_pipeline/ beside the script. tests/test_layout.py checks this index
against the imports.

    __init__           1 2 3 4  this index
    errors             1 2 3 4  one-line errors: UsageError, the argparse parser and types, how a
                                script exits
    settings           1 2 3 4  a script's settings declared once, as fields of group
                                dataclasses; its command line built from them
    tf_startup         1 2 3 4  TensorFlow's start-up log, held back in a file whose path is
                                printed if start-up fails, crashes or is slow; steps 1-2 kept off
                                the TPU
    storage            1 2 3 4  local or gs:// output folders, checked before any work (a
                                short-lived probe); files written whole, folders published
    gcs_probe          1 2 3 4  the gs:// paths looked up, and an output's written to, in the
                                short-lived child process storage.py starts
    file_writes        1 2 3 4  the writes through TensorFlow's file system (local or gs://):
                                files written whole, folders staged and published
    contract           1 2 3 4  the files the steps hand on: names, manifest keys, the record
                                feature, loading the tokenizer
    corpus             1 2      local or gs:// corpus files, one or a glob: plain text, JSON lines,
                                CSV, Parquet, the text formats also compressed, read as a stream
    hub_datasets       1 2   4  a Hub dataset's split, downloaded or streamed, through datasets
    hub                1   3 4  Hub repositories and one-commit pushes over HTTP, failures in one
                                line
    cards              1   3 4  what every README.md card shares: the metadata block, folders
                                named without local paths; train_unigram.py's tokenizer card
    unigram_training   1        train_unigram.py's engine: the corpus read, the Unigram model
                                trained, saved as a transformers tokenizer folder
    shard_writing        2      prepare_tfrecord_shards.py's engine: the corpus read, tokenized,
                                packed and written as TFRecord shards
    packing              2      the bytes of the shards: tokenize, pack, tf.train.Example records,
                                TFRecords
    split_folder         2      a split's folder while it is written (checks, clean-up, its
                                manifest last) and its manifest.json, built from what each block
                                gave
    beam_pipeline        2      the step on Apache Beam: the pipeline graph, what its workers run,
                                and a corpus file read in blocks
    beam_launcher        2      prepare_tfrecord_shards.py --runner: Beam's checks before any work,
                                the runner, the run and its errors
    hardware               3 4  the Hardware settings group and the one decision whether a run
                                asks for the TPU, read before TensorFlow loads
    hosts                  3 4  the strategy (the TPU started by tpu_runtime); on several hosts,
                                who writes and which shard files each host's input pipeline reads
    tpu_runtime            3 4  the TPU VM's TPU started by PJRT, its variables set before
                                TensorFlow loads, or a pod slice's client set up; why it cannot
                                start, in one line
    tpu_slice              3 4  a pod slice: its client's checks (cloud-tpu-client, the workers'
                                TensorFlow, gs:// paths), and a slice's host told apart from a
                                single-host TPU VM by its metadata server
    model_folder           3 4  a finished model's folder: the output checked before any work,
                                refused unless replaced on request, saved with its PyTorch copy,
                                published so that it never looks finished early
    pretrained_model       3 4  the published model a run starts from: to fine-tune, or the
                                parent of continued pretraining with all its rules; a folder or
                                Hub id, checked with its tokenizer, its weights loaded
    pytorch_weights        3 4  a TF model's weights in PyTorch transformers' names, both ways,
                                without torch: a model published with safetensors read, the
                                PyTorch copy that transformers 5 loads written
    shard_checks           3    the shards run_mlm.py is given, checked before any work: manifests,
                                sizes, first records; a corrupt one named during training
    architecture           3 4  the architecture to train from random weights: a config from
                                --pretrained_model_config, --config_overrides, the tokenizer's ids
    modernbert_config      3 4  ModernBERT's config read as transformers 5 reads it (layer
                                types, RoPE bases, window), both spellings kept in agreement
    modernbert             3 4  ModernBERT in TF, named as transformers 5's PyTorch model and
                                registered with transformers' TF auto classes; attention whose
                                memory grows with the length past a measured switch
    whole_words            3    --whole_word_masking: which tokens start a word, the masking of
                                whole words
    metrics                3    the accuracy metrics, over the masked positions only
    mixture                3    several --train_dataset folders drawn by weight, several named
                                --eval_dataset sets: their flags checked before any work
    masked_lm_data         3    run_mlm.py's data: the shards checked against the tokenizer, an
                                input pipeline per host, the masking in tf.data
    masked_lm_model        3    run_mlm.py's model: from scratch or a parent's weights, the
                                trainer of the masked positions, accumulation, schedule, fit()
    checkpoints            3    run_mlm.py's output folder as a run goes: started afresh or
                                checked to be this run's, checkpoints saved and restored on resume
    branching              3    --branch_from: a phase from another run's checkpoint, its
                                weights, moments, step and learning rate, the parent's settings
    segments               3 4  optimizer steps: the warmup's; run_mlm.py's counted through epochs
                                and fit() calls of fixed shape
    training_logs          3 4  fit()'s progress display; TensorBoard scalars, the CSV log, the
                                curves PNG, the summary line
    averaging              3    --average_last: the mean of the last checkpoints' weights handed
                                on, the last step's model beside it; too few refused before work
    model_card             3    run_mlm.py's model card, written with the curves beside the model
    hub_pusher             3    run_mlm.py's Hub pushes: a snapshot at each evaluation in the
                                background, the final model last
    training_run           3    what a run does around fit(): chief and workers, resume,
                                callbacks, the end
    validation_sets        3    several named --eval_dataset sets: each scored at every
                                evaluation and logged under its name
    preflight              3 4  --preflight: a few of the run's own steps timed after the
                                compile, the hardware, the peak memory against the device's, the
                                whole run's projected time; nothing written
    labelled_data            4  run_classifier.py's texts and labels (a Hub dataset or .tsv, .csv,
                                .jsonl files), checked
    classifier_model         4  run_classifier.py's engine: the examples encoded and batched,
                                the classifier built, fit and scored
    classifier_folder        4  run_classifier.py's model card, eval_results.json and Hub push
"""
