"""run_mlm.py's architecture to train from random weights: a config to start from
(--pretrained_model_config), the changes --config_overrides makes, each refused in one line when
transformers would fail on it later, and the tokenizer's size and special ids. (Continuing a model,
its config is the parent's: pretrained_model.Parent.)

Part of the engine: whether a config has a TF masked LM is asked of transformers' TF auto classes,
whose import loads TensorFlow, so the scripts import this module after the TPU's start-up."""

import json
import os

from transformers import AutoConfig, RobertaConfig, TFAutoModelForMaskedLM

from . import modernbert_config
from .contract import FIXED_PADDING_INDEX_MODELS
from .errors import UsageError, first_line
from .storage import is_local_path


def load_config(source=None, overrides=None, trust_remote_code=False):
    """The config named by `source` (a Hub id, a folder or a config.json; None: RoBERTa-base's,
    transformers' RobertaConfig()) with `overrides` ("key=value,key=value") applied.

    Only a config is read, never weights: training starts from random ones.
    """
    flag = "--pretrained_model_config"
    if source is not None and os.path.isfile(source) and not source.endswith(".json"):
        raise UsageError(f"{flag} {source} is a file but not JSON; pass a config.json.")
    if source is not None and not os.path.exists(source) and is_local_path(source):
        raise UsageError(f"{flag} {source} does not exist; pass a config.json or a Hub id.")
    try:
        config = (
            RobertaConfig()
            if source is None
            else AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
        )
    except (OSError, ValueError) as error:
        raise UsageError(f"could not load {flag} {source}: {first_line(error)}") from None
    apply_overrides(config, overrides)
    where = f"{flag} {source}" + (f" with --config_overrides {overrides}" if overrides else "")
    check_masked_lm(config, where, "pass a masked LM's config")
    modernbert_config.check_local_attention(
        config,
        where,
        "pass an even one: --config_overrides local_attention={even} (the same) or {larger}",
    )
    if config.hidden_size % config.num_attention_heads:
        raise UsageError(
            f"hidden_size {config.hidden_size} is not divisible by num_attention_heads "
            f"{config.num_attention_heads}; fix --config_overrides."
        )
    return config


def fit_to_tokenizer(config, tokenizer, max_length):
    """The config takes the tokenizer's vocabulary size and special ids, and enough positions for
    `max_length` tokens: max_length + position_offset(config) (the config's own number when it is
    larger)."""
    config.vocab_size, config.pad_token_id = len(tokenizer), tokenizer.pad_token_id
    config.bos_token_id = tokenizer.bos_token_id
    if config.bos_token_id is None:
        config.bos_token_id = tokenizer.cls_token_id
    config.eos_token_id = tokenizer.eos_token_id
    if config.eos_token_id is None:
        config.eos_token_id = tokenizer.sep_token_id
    config.cls_token_id, config.sep_token_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    config.mask_token_id = tokenizer.mask_token_id
    check_padding_index(config.model_type, tokenizer.pad_token_id, tokenizer.pad_token)
    positions = max_length + position_offset(config)
    config.max_position_embeddings = max(config.max_position_embeddings, positions)


# TF RoBERTa and its kin number positions from their padding index + 1, and fix that index at 1
TF_PADDING_INDEX = 1


def position_offset(config):
    """The rows of the position table that come before the first token's: the families that
    number positions from the padding index + 1 (transformers' create_position_ids_from_input_ids)
    never use the rows up to it. RoBERTa, XLM-R and their kin (FIXED_PADDING_INDEX_MODELS): 2, the
    index TF fixes at 1, + 1 (PyTorch takes pad_token_id, which must then be 1); ESM with absolute
    positions: pad_token_id + 1. Every other family: 0. BERT's table starts at position 0;
    ModernBERT's positions are rotary, with no table at all, and its max_position_embeddings is the
    longest sequence (transformers 5's ModernBertConfig)."""
    if config.model_type in FIXED_PADDING_INDEX_MODELS:
        return TF_PADDING_INDEX + 1
    absolute = getattr(config, "position_embedding_type", "absolute") == "absolute"
    if config.model_type == "esm" and absolute:
        return config.pad_token_id + 1
    return 0


def longest_sequence(config):
    """The most tokens a sequence of the model may hold: its max_position_embeddings less the rows
    before the first position (position_offset)."""
    return config.max_position_embeddings - position_offset(config)


def overrides_items(overrides):
    """(key, value) of each "key=value" of --config_overrides, values read as JSON where they are
    (numbers, booleans, null), else kept as strings."""
    for item in filter(None, (part.strip() for part in (overrides or "").split(","))):
        key, separator, value = item.partition("=")
        if not separator:
            raise UsageError(
                f"--config_overrides item {item!r} is not key=value; e.g. hidden_size=256."
            )
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
        yield key.strip(), value


def apply_overrides(config, overrides):
    items = list(overrides_items(overrides))
    for key, value in items:
        if not hasattr(config, key):
            raise UsageError(
                f"--config_overrides names {key!r}, which {type(config).__name__} does not have."
            )
        setattr(config, key, value)
    if config.model_type == "modernbert" and {key for key, _ in items} & MODERNBERT_LAYOUT:
        modernbert_config.use_legacy_layout(config)  # a transformers 5 layout would hide the change


# ModernBERT's fields that transformers 5 restates as layer_types and rope_parameters
MODERNBERT_LAYOUT = {
    "num_hidden_layers",
    "global_attn_every_n_layers",
    "global_rope_theta",
    "local_rope_theta",
}


def register_tf_family(config):
    """Families transformers 4.57 has no TF class for, written here on its own config (ModernBERT:
    modernbert.py), join its TF auto classes when a config names one, so the scripts build, load
    and save them as any transformers TF model; the module is imported only then."""
    if config.model_type == "modernbert":
        from . import modernbert  # registers itself with TFAutoModelForMaskedLM and the others

        modernbert.normalize_config(config)


def has_tf_masked_lm(config):
    """Whether TFAutoModelForMaskedLM builds `config`: a transformers TF masked LM, or a family
    registered by register_tf_family()."""
    register_tf_family(config)
    return type(config) in TFAutoModelForMaskedLM._model_mapping


# What run_mlm.py trains: transformers 4.57's TF masked LMs, and the families written here
MASKED_LM_FAMILIES = (
    "roberta, bert, xlm-roberta, modernbert, or another family with a TF masked-LM class in "
    "transformers 4.57 (albert, camembert, deberta-v2, distilbert, ...)"
)


def check_masked_lm(config, where, remedy):
    """A config TFAutoModelForMaskedLM cannot build is refused in one line: `where` names it (the
    flag and its value), `remedy` says what to pass instead; the families that work follow."""
    if not has_tf_masked_lm(config):
        raise UsageError(
            f"{where} is a {config.model_type} model, which has no TF masked-LM class in "
            f"transformers, so it cannot be pretrained here; {remedy}: {MASKED_LM_FAMILIES}."
        )


def check_padding_index(model_type, pad_token_id, pad_token=None, remedy=None):
    """TF RoBERTa (and its kin) numbers positions from a padding index fixed at 1, PyTorch RoBERTa
    from pad_token_id: with another pad id every position would shift between the two frameworks."""
    if model_type in FIXED_PADDING_INDEX_MODELS and pad_token_id != 1:
        token = f"pad token {pad_token!r}" if pad_token is not None else "pad token"
        remedy = remedy or "retrain the tokenizer with train_unigram.py, which puts <pad> at id 1"
        raise UsageError(
            f"the tokenizer's {token} has id {pad_token_id}, but transformers' TF {model_type} "
            "numbers positions from a padding index fixed at 1 (its PyTorch twin uses "
            f"pad_token_id), so the model would differ between frameworks; {remedy}."
        )
