"""run_mlm.py's model architecture from its flags: a config to start from, and the changes
--config_overrides makes, each refused in one line when transformers would fail on it later; or,
continuing a model (--model_name_or_path), that model's config, whose shape stays as it is."""

import json
import os

from .errors import UsageError, first_line
from .pytorch_export import check_padding_index


def load_config(source=None, overrides=None, trust_remote_code=False):
    """The config named by `source` (a Hub id, a folder or a config.json; None: RoBERTa-base's,
    transformers' RobertaConfig()) with `overrides` ("key=value,key=value") applied.

    Only a config is read, never weights: training starts from random ones.
    """
    from transformers import AutoConfig, RobertaConfig

    flag = "--pretrained_model_config"
    if source is not None and os.path.isfile(source) and not source.endswith(".json"):
        raise UsageError(f"{flag} {source} is a file but not JSON; pass a config.json.")
    if source is not None and not os.path.exists(source) and source.startswith((".", "/")):
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
    if config.hidden_size % config.num_attention_heads:
        raise UsageError(
            f"hidden_size {config.hidden_size} is not divisible by num_attention_heads "
            f"{config.num_attention_heads}; fix --config_overrides."
        )
    return config


def fit_to_tokenizer(config, tokenizer, max_length):
    """The config takes the tokenizer's vocabulary size and special ids, and enough position
    embeddings for `max_length` tokens: RoBERTa numbers positions from pad_token_id + 1
    (max_length + pad + 1 rows), other models from 0."""
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
    positions = max_length + tokenizer.pad_token_id + 1
    config.max_position_embeddings = max(config.max_position_embeddings, positions)


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
    for key, value in overrides_items(overrides):
        if not hasattr(config, key):
            raise UsageError(
                f"--config_overrides names {key!r}, which {type(config).__name__} does not have."
            )
        setattr(config, key, value)


def check_continued_overrides(overrides, name):
    """--model_name_or_path `name`: --config_overrides may change the model's dropout (continued
    pretraining often turns it off); any other key would reshape its weights or change what they
    mean, so it is refused."""
    reshaping = [key for key, _ in overrides_items(overrides) if "dropout" not in key]
    if reshaping:
        raise UsageError(
            f"--config_overrides {overrides} would change {', '.join(reshaping)} of the model "
            f"--model_name_or_path {name}, whose weights continued pretraining starts from; only "
            "dropout may change (e.g. hidden_dropout_prob=0), or leave out --model_name_or_path "
            "to pretrain another shape from random weights."
        )


def continued_config(config, overrides, name):
    """--model_name_or_path: the config of the model `name` as it is, but for its dropout."""
    check_continued_overrides(overrides, name)
    apply_overrides(config, overrides)
    config._name_or_path = name  # as given: what run_settings.json records, not a local copy
    return config
