"""Tiny published-style masked LMs for the continued-pretraining tests, one in each tokenizer family
the Hub's popular models use, made here from nothing (no download):

    roberta       byte-level BPE (roberta-base's kind): <s> ... </s>, <mask>, pad id 1, words
                  marked by a leading "Ġ"
    bert          WordPiece (bert-base-uncased's kind): [CLS] ... [SEP], [MASK], pieces that go on
                  a word marked "##"
    xlm-roberta   SentencePiece Unigram (xlm-roberta-base's kind): <s> ... </s>, <mask>, words
                  marked by "▁"
    modernbert    byte-level BPE (answerdotai/ModernBERT-base's kind, OLMo's tokenizer): [CLS] ...
                  [SEP], [MASK] (taking the space before it), [PAD], [UNK] after the vocabulary,
                  words marked by "Ġ"; the model a ModernBertForMaskedLM made and saved by
                  transformers 5 (PyTorch safetensors, its config.json with layer_types and
                  rope_parameters), since transformers 4.57 has no TF ModernBERT to make it with

and one tokenizer without a model, for step 2 and the masking:

    mmbert        SentencePiece-style BPE with byte fallback (Gemma's kind, which jhu-clsp/mmBERT
                  uses): <bos> ... <eos>, <mask>, <pad> id 0, words marked by "▁"

Each is saved as a model repository is laid out on the Hub (config.json, tf_model.h5, the
tokenizer's files), or with PyTorch safetensors only (what most Hub models carry today), or put
into a Hugging Face cache as a downloaded Hub model, so that a Hub id resolves offline through
the real code path. A ModernBERT stand-in for the Hub, in a test:

    save_parent("modernbert", texts, folder)  # runs transformers 5 in .venv-transformers5
    cache_as_hub_model(folder, "tiny-org/modernbert", os.environ["HF_HUB_CACHE"])
"""

import json
import math
import shutil
from pathlib import Path

from helpers import MAX_LENGTH, REPO, run_in_transformers5

FAMILIES = ("roberta", "bert", "xlm-roberta", "modernbert")
TOKENIZER_FAMILIES = (*FAMILIES, "mmbert")  # mmbert: a tokenizer only
TRANSFORMERS5_SCRIPT = REPO / "tests" / "transformers5_modernbert.py"
# The tiny ModernBERT: global and local layers (global, local, local, global), a window of 8
# tokens (4 each side) shorter than the shards' MAX_LENGTH, RoPE bases other than the defaults.
MODERNBERT = dict(
    hidden_size=32,
    intermediate_size=40,
    num_attention_heads=2,
    num_hidden_layers=4,
    global_attn_every_n_layers=3,
    local_attention=8,
    global_rope_theta=2000.0,
    local_rope_theta=40.0,
    max_position_embeddings=64,
)
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

    if family == "modernbert":
        return modernbert_tokenizer(texts)
    if family == "mmbert":
        return gemma_tokenizer(texts)
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


def modernbert_tokenizer(texts):
    """ModernBERT-base's kind: OLMo's byte-level BPE (no prefix space, so a text's first word has no
    "Ġ"), a few added tokens before the vocabulary and its specials after it ([UNK], [CLS], [SEP],
    [PAD], then [MASK], which takes the space before it), [CLS] $A [SEP], no token_type_ids; a
    PreTrainedTokenizerFast, as its tokenizer_config.json names it."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["|||IP_ADDRESS|||", "<|padding|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(texts, trainer)
    backend.add_special_tokens(["<|endoftext|>", "[UNK]", "[CLS]", "[SEP]", "[PAD]"])
    mask = AddedToken("[MASK]", lstrip=True, rstrip=False, normalized=False, special=True)
    backend.add_special_tokens([mask])
    cls, sep = (("[CLS]", backend.token_to_id("[CLS]")), ("[SEP]", backend.token_to_id("[SEP]")))
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0",
        special_tokens=[cls, sep],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token=mask,
        model_input_names=["input_ids", "attention_mask"],
        model_max_length=MODERNBERT["max_position_embeddings"],
        clean_up_tokenization_spaces=True,
    )


def gemma_tokenizer(texts):
    """Gemma's kind, which mmBERT uses: BPE over text whose spaces are "▁" (SentencePiece's
    layout: no prefix "▁" on a text's first word), bytes for what the vocabulary lacks
    (<0x00> ... <0xFF>), <pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4; <bos> $A <eos>."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=special)
    backend.train_from_iterator(texts, trainer)
    # SentencePiece's byte fallback: the 256 byte pieces join the vocabulary
    layout = json.loads(backend.to_str())
    vocab = layout["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    layout["model"].update(byte_fallback=True, fuse_unk=True)
    backend = Tokenizer.from_str(json.dumps(layout))
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    bos, eos = ("<bos>", 2), ("<eos>", 1)
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", pair="<bos> $A <eos> $B <eos>", special_tokens=[bos, eos]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        mask_token="<mask>",
        cls_token="<bos>",
        sep_token="<eos>",
        model_input_names=["input_ids", "attention_mask"],
    )


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


def modernbert_build(folder, tokenizer, seed=0):
    """The "build" entry of a transformers 5 request (tests/transformers5_modernbert.py) for a
    tiny random ModernBertForMaskedLM of MODERNBERT's shape in `folder`, with `tokenizer`'s special
    ids (bos and eos: [CLS] and [SEP], as ModernBERT-base's config has them) and a vocabulary
    padded to a multiple of 64, as ModernBERT-base's 50,368 rows for its 50,285 tokens are."""
    config = dict(
        MODERNBERT,
        vocab_size=64 * math.ceil(len(tokenizer) / 64),
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )
    return {"folder": str(folder), "kind": "masked_lm", "config": config, "seed": seed}


def run_transformers5(request, work_folder, what="the parents"):
    """Run tests/transformers5_modernbert.py once on `request` (a dict), its files in
    `work_folder`; returns its report. The test fails, with the script's error, if it fails."""
    work_folder = Path(work_folder)
    work_folder.mkdir(parents=True, exist_ok=True)
    request_path, report_path = work_folder / "request.json", work_folder / "report.json"
    request_path.write_text(json.dumps({"build": [], "load": [], "configs": [], **request}))
    return run_in_transformers5(TRANSFORMERS5_SCRIPT, request_path, report_path, what)


def save_parent(family, texts, folder, layout=None):
    """A tiny parent of `family` saved in `folder` (made), in the Hub's layout: "tf" (config.json,
    tf_model.h5, tokenizer; the default), "pytorch" (config.json, model.safetensors in PyTorch's
    names and layouts, tokenizer: no TF weights), or "base" (a TF model without its masked-LM
    head). Returns the TF model saved. A ModernBERT has the "pytorch" layout only, as transformers
    5 saves it (made there: one subprocess); None is returned."""
    from transformers import TFAutoModel

    from mlm_pipeline.pytorch_weights import write_pytorch_copy

    folder = Path(folder)
    if family == "modernbert":
        if layout not in (None, "pytorch"):
            raise ValueError(f"a ModernBERT parent is saved by transformers 5, not as {layout!r}")
        tokenizer = family_tokenizer(family, texts)
        tokenizer.save_pretrained(folder)
        work = folder.parent / f"{folder.name}-transformers5"
        run_transformers5({"build": [modernbert_build(folder, tokenizer)]}, work, "ModernBERT")
        shutil.rmtree(work)
        return None
    layout = layout or "tf"
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
    `repo_id`, so that from_pretrained(repo_id) finds it offline (HF_HUB_OFFLINE=1), in place of
    any model an earlier test cached under that id."""
    commit = "0" * 40
    repo = Path(hub_cache) / f"models--{repo_id.replace('/', '--')}"
    # A test process caches one model of an id at a time: the one its latest test put there.
    shutil.rmtree(repo / "snapshots" / commit, ignore_errors=True)
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return repo


def config_of(folder):
    return json.loads((Path(folder) / "config.json").read_text())
