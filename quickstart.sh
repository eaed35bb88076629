#!/usr/bin/env bash
# The whole pipeline in one command, offline, on a laptop CPU: install the requirements into .venv, write a
# corpus from the documentation that ships with CPython, train a tokenizer, write 128-token shards, pretrain a
# tiny RoBERTa for about 3 minutes and print fill-mask predictions. Everything lands in quickstart_output/.
#
#   bash quickstart.sh
#
# Inside an activated virtualenv or conda env, it installs into that environment instead of .venv.
set -euo pipefail
cd "$(dirname "$0")"
out=quickstart_output

if [ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]; then
  python=python
else
  [ -x .venv/bin/python ] || python3 -m venv .venv
  python=.venv/bin/python
fi
"$python" -m pip install --quiet --disable-pip-version-check -r requirements.txt

# Nothing in the quickstart needs the network.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TF_CPP_MIN_LOG_LEVEL=2

"$python" make_quickstart_corpus.py --output_dir "$out/corpus"

"$python" train_unigram.py --train_file "$out/corpus/train.txt" --vocab_size 4000 \
  --output_dir "$out/tokenizer" --overwrite_output_dir

for split in train validation; do
  "$python" prepare_tfrecord_shards.py --"$split"_file "$out/corpus/$split.txt" --split "$split" \
    --tokenizer_name_or_path "$out/tokenizer" --max_length 128 --output_dir "$out/shards" --overwrite_output_dir
done

# The CPU recipe of BENCHMARKS.md ("Machines and data", "Quality per minute"). The tokenizer above has 4,000 pieces:
# a smaller embedding table and output layer make each step cheaper. The first 40% of the steps see each
# 128-token sequence cut into 8 pieces of 16 tokens (as many tokens a step), where a model leaves the "answer
# 'the' everywhere" plateau far sooner; the rest trains all 128 positions. Training masks 30% of the tokens
# (evaluation keeps 15%), the learning rate holds its peak until the last 25% of the steps, and batches of 16
# buy more steps a minute. Dropout is off, as in every run of that budget table. The recipe there also
# lower-cases and masks 15%, for a lower-cased task downstream; Python's documentation is cased and this
# model ends at fill-mask, so it keeps the choices that reach [MASK] accuracy soonest.

"$python" run_mlm.py --no_tpu \
  --train_dataset "$out/shards/train" --eval_dataset "$out/shards/validation" \
  --tokenizer "$out/tokenizer" --output_dir "$out/model" --overwrite_output_dir \
  --config_overrides hidden_size=128,num_hidden_layers=2,num_attention_heads=2,intermediate_size=512,hidden_dropout_prob=0,attention_probs_dropout_prob=0 \
  --per_replica_batch_size 16 --max_steps 2000 --learning_rate 1e-3 --warmup_ratio 0.02 --decay_ratio 0.25 \
  --short_sequence_length 16 --short_sequence_ratio 0.4 --train_mlm_probability 0.3

# The libraries' start-up chatter (TensorFlow's C++ log, transformers' notices) goes to a file, shown on failure.
"$python" - "$out/model" 2>"$out/fill_mask.log" <<'PY' || { cat "$out/fill_mask.log" >&2; exit 1; }
import sys

from transformers import pipeline

# dtype=None: transformers 4.57's pipeline() looks its default dtype ("auto") up in PyTorch otherwise.
fill_mask = pipeline("fill-mask", model=sys.argv[1], dtype=None)
for sentence in ["The [MASK] statement is used to define a function.", "Return a new [MASK] of the list."]:
    guesses = ", ".join(f"{p['token_str']!r} ({p['score']:.2f})" for p in fill_mask(sentence, top_k=5))
    print(f"{sentence}\n    -> {guesses}")
PY
echo "Done: the model and its tokenizer are in $out/model"
