"""Tiny published-style masked LMs for the continued-pretraining tests, one in each tokenizer family
the Hub's popular models use, made here from nothing (no download):

    roberta       byte-level BPE (roberta-base's kind): <s> ... </s>, <mask>, pad id 1, words
                  marked by a leading "Ġ"
    bert          WordPiece (bert-base-uncased's kind): [CLS] ... [SEP], [MASK], pieces that go on
                  a word marked "##"
    xlm-roberta   SentencePiece Unigram (xlm-roberta-base's kind): <s> ... </s>, <mask>, words
                  marked by "▁"

Each is saved as a model repository is laid out on the Hub (config.json, tf_model.h5, the
tokenizer's files), or with PyTorch safetensors only (what most Hub models carry today), or put
into a Hugging Face cache as a downloaded Hub model, so that a Hub id resolves offline through
the real code path.
"""

import json
import shutil
from pathlib import Path

from helpers import MAX_LENGTH

FAMILIES = ("roberta", "bert", "xlm-roberta")
SHAPE = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


def family_tokenizer(family, texts):
    """A transformers fast tokenizer of the family, trained on `texts` with the tokenizers
    library, its special tokens where the family's published models have them."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import BertTokenizerFast, RobertaTokenizerFast, XLMRobertaTokenizerFast

    if family == "bert":
        special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        backend.normalizer = normalizers.BertNormalizer(lowercase=True)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=special)
        backend.train_from_iterator(texts, trainer)
        cls, sep = ("[CLS]", backend.token_to_id("[CLS]")), ("[SEP]", backend.token_to_id("[SEP]"))
        backend.post_processor = processors.BertProcessing(sep, cls)
        return BertTokenizerFast(tokenizer_object=backend)
    special = ["<s>", "<pad>", "</s>", "<unk>"]
    if family == "roberta":
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=special,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        backend.train_from_iterator(texts, trainer)
        backend.add_special_tokens(["<mask>"])
        backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        return RobertaTokenizerFast(tokenizer_object=backend)
    backend = Tokenizer(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=special, unk_token="<unk>")
    backend.train_from_iterator(texts, trainer)
    backend.add_special_tokens(["<mask>"])
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    return XLMRobertaTokenizerFast(tokenizer_object=backend)


def family_masked_lm(family, tokenizer, seed=0):
    """A tiny TF masked LM of the family, its weights random (seeded) and built."""
    import tf_keras
    from transformers import (
        BertConfig,
        RobertaConfig,
        TFAutoModelForMaskedLM,
        XLMRobertaConfig,
    )

    tf_keras.utils.set_random_seed(seed)
    if family == "bert":
        config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=64, **SHAPE)
    else:
        config_class = RobertaConfig if family == "roberta" else XLMRobertaConfig
        # RoBERTa numbers positions from pad_token_id + 1
        config = config_class(
            vocab_size=len(tokenizer),
            max_position_embeddings=MAX_LENGTH + 2,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            type_vocab_size=1,  # as roberta-base and xlm-roberta-base have it
            **SHAPE,
        )
    config.pad_token_id = tokenizer.pad_token_id
    model = TFAutoModelForMaskedLM.from_config(config)
    model(model.dummy_inputs)
    return model


def save_parent(family, texts, folder, layout="tf"):
    """A tiny parent of `family` saved in `folder` (made), in the Hub's layout: "tf" (config.json,
    tf_model.h5, tokenizer), "pytorch" (config.json, model.safetensors in PyTorch's names and
    layouts, tokenizer: no TF weights), or "base" (a TF model without its masked-LM head). Returns
    the TF model saved."""
    from transformers import TFAutoModel

    from mlm_pipeline.pytorch_weights import write_pytorch_copy

    folder = Path(folder)
    tokenizer = family_tokenizer(family, texts)
    model = family_masked_lm(family, tokenizer)
    if layout == "tf":
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    elif layout == "pytorch":
        # run_mlm.py's PyTorch copy is such a folder: moved into place
        staging = folder.parent / f"{folder.name}-staging"
        write_pytorch_copy(model, tokenizer, staging)
        shutil.move(staging / "pytorch", folder)
        shutil.rmtree(staging)
    elif layout == "base":
        base = TFAutoModel.from_config(model.config)
        base(base.dummy_inputs)
        base.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return model


def cache_as_hub_model(folder, repo_id, hub_cache):
    """Put the files of `folder` into the Hugging Face cache `hub_cache` as a downloaded Hub model
    `repo_id`, so that from_pretrained(repo_id) finds it offline (HF_HUB_OFFLINE=1)."""
    commit = "0" * 40
    repo = Path(hub_cache) / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return repo


def config_of(folder):
    return json.loads((Path(folder) / "config.json").read_text())
