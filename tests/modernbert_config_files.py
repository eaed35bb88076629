"""ModernBERT config.json files as the tests read and write them (mlm_pipeline/modernbert_config.py
reads a config as transformers 5 does; these wrap it for a file's contents or a folder)."""

import copy
import json
import os

from mlm_pipeline.modernbert_config import normalize_config


def config_from_dict(dictionary):
    """A transformers 4.57 ModernBertConfig from a config.json's contents, saved by transformers 4
    or 5, with the thetas and layer types transformers 5 would read."""
    from transformers import ModernBertConfig

    return normalize_config(ModernBertConfig.from_dict(dictionary))


def load_config(folder):
    """config_from_dict() of `folder`/config.json."""
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as file:
        return config_from_dict(json.load(file))


def transformers5_config_dict(config):
    """The contents of a config.json that transformers 5 reads as this model (and 4.57 too): both
    spellings, in agreement. `config` itself is not changed."""
    return normalize_config(copy.deepcopy(config)).to_dict()


def save_transformers5_config(config, folder):
    """Write `folder`/config.json from transformers5_config_dict(); returns its path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.json")
    with open(path, "w", encoding="utf-8") as file:
        json.dump(transformers5_config_dict(config), file, indent=2, sort_keys=True)
        file.write("\n")
    return path
