"""mlm_pipeline/modernbert.py, the TF ModernBERT, against transformers 5's PyTorch ModernBERT.

Both directions go through the files the pipeline reads and writes: PyTorch models made and saved
by transformers 5 are read with pytorch_weights.assign_pytorch_weights(); TF models from random
weights are written with pytorch_weights.pytorch_state_dict() and loaded by transformers 5. One
subprocess in .venv-transformers5 (tests/transformers5_modernbert.py) does all the PyTorch work.

The tiny configs have global and local layers, sequences three times the local window, RoPE bases
other than the defaults (which transformers 4.57 would fall back to when it reads a transformers 5
config.json) and padding; one has every bias, a tied decoder and "cls" pooling, the other no bias,
an untied decoder, "mean" pooling and a layer pattern no period describes. Each runs on both of
the attention's paths: the dense one of short sequences, and the memory-linear one of long sequences
(local layers block by block, global ones chunk by chunk), forced here by lowering the switch. A
third config runs at 8,192 tokens, where the switch itself takes the memory-linear path: head size
64, ModernBERT-base's window of 128, padding.
"""

import json

import modernbert_config_files as config_files
import numpy as np
import pytest
from helpers import REPO, require_transformers5, run_in_transformers5

TRANSFORMERS5_SCRIPT = REPO / "tests" / "transformers5_modernbert.py"

FULL, SLIDING = "full_attention", "sliding_attention"
SHARED = {
    "vocab_size": 61,
    "hidden_size": 32,
    "intermediate_size": 40,
    "num_attention_heads": 2,
    "max_position_embeddings": 64,
    "local_attention": 8,  # 4 tokens each side, within sequences of 24
    "num_labels": 3,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "cls_token_id": 1,
    "sep_token_id": 2,
}
CONFIGS = {
    "biases": {
        **SHARED,
        "num_hidden_layers": 4,
        "global_attn_every_n_layers": 3,  # global, local, local, global
        "global_rope_theta": 2000.0,
        "local_rope_theta": 40.0,
        "attention_bias": True,
        "mlp_bias": True,
        "norm_bias": True,
        "decoder_bias": True,
        "classifier_bias": True,
        "classifier_pooling": "cls",
    },
    "no_biases": {
        **SHARED,
        "num_hidden_layers": 5,
        "layer_types": [FULL, SLIDING, FULL, FULL, SLIDING],
        "global_rope_theta": 500.0,
        "local_rope_theta": 25.0,
        "attention_bias": False,
        "mlp_bias": False,
        "norm_bias": False,
        "decoder_bias": False,
        "classifier_bias": False,
        "classifier_pooling": "mean",
        "tie_word_embeddings": False,
        "hidden_activation": "gelu_pytorch_tanh",
        "classifier_activation": "silu",
    },
}
KINDS = ("masked_lm", "classifier")
LENGTH, LENGTHS = 24, (24, 17, 5)  # the last row: padded queries with no token in their window
# Positions the sparse head gathers, one row per sequence
POSITIONS = [[0, 5, 23], [1, 16, 20], [0, 4, 11]]
# Float32 on both sides, different kernels
RTOL, ATOL = 1e-4, 1e-4
# The long sequence: head size 64, window 128, global, local, local; one row of 8,192 tokens whose
# last 2,192 are padding (most of them with no token in their window)
LONG = {
    **SHARED,
    "hidden_size": 64,
    "intermediate_size": 32,
    "num_attention_heads": 1,
    "num_hidden_layers": 3,
    "global_attn_every_n_layers": 3,
    "local_attention": 128,
    "max_position_embeddings": 8192,
}
LONG_LENGTH, LONG_TOKENS = 8192, 6000
PATHS = ("dense", "memory_linear")


@pytest.fixture(params=PATHS)
def attention_path(request, monkeypatch):
    """The attention's path for the test: "dense", as at these short lengths, or "memory_linear",
    forced by switching at length 0, with a global layer's query chunk of 5 (5 chunks of the 24
    tokens, the last one padded); a local layer's blocks are its half window, 4."""
    from mlm_pipeline import modernbert

    if request.param == "memory_linear":
        monkeypatch.setattr(modernbert, "DENSE_ATTENTION_UP_TO", 0)
        monkeypatch.setattr(modernbert, "GLOBAL_QUERY_CHUNK", 5)
    return request.param


def batch():
    """The padded batch every model sees: ids (int32) and attention mask."""
    rng = np.random.default_rng(0)
    input_ids = np.zeros([len(LENGTHS), LENGTH], np.int32)
    attention_mask = np.zeros([len(LENGTHS), LENGTH], np.int32)
    for row, length in enumerate(LENGTHS):
        input_ids[row, :length] = rng.integers(3, SHARED["vocab_size"], length)
        attention_mask[row, :length] = 1
    return input_ids, attention_mask


def long_batch():
    """The long sequence's ids and mask, [1, LONG_LENGTH]."""
    rng = np.random.default_rng(1)
    input_ids = np.zeros([1, LONG_LENGTH], np.int32)
    input_ids[0, :LONG_TOKENS] = rng.integers(3, LONG["vocab_size"], LONG_TOKENS)
    return input_ids, (input_ids > 0).astype(np.int32)


def model_class(kind):
    from mlm_pipeline import modernbert

    return {
        "masked_lm": modernbert.TFModernBertForMaskedLM,
        "classifier": modernbert.TFModernBertForSequenceClassification,
    }[kind]


def logits_of(model, training=False):
    input_ids, attention_mask = batch()
    output = model(input_ids=input_ids, attention_mask=attention_mask, training=training)
    return output.logits.numpy()


def random_tf_model(name, kind, seed):
    """A built TF model of CONFIGS[name] whose every weight is moved off its initial value, so that
    zero biases and unit norms are not all the export is checked on."""
    import tensorflow as tf
    from transformers import ModernBertConfig

    tf.random.set_seed(seed)
    model = model_class(kind)(ModernBertConfig(**CONFIGS[name]))
    model.build_in_name_scope()
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(weight.numpy() + 0.05 * rng.standard_normal(weight.shape).astype(np.float32))
    return model


def write_pytorch_folder(model, folder):
    """What pytorch_weights.write_pytorch_copy() writes, less the tokenizer."""
    from safetensors.numpy import save_file

    from mlm_pipeline import pytorch_weights

    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(folder))
    save_file(
        pytorch_weights.pytorch_state_dict(model),
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )


@pytest.fixture(scope="module")
def transformers5_python():
    return require_transformers5()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{(config name, kind): (random TF model, its folder for transformers 5, its logits)}."""
    root = tmp_path_factory.mktemp("from-tf")
    models = {}
    for seed, (name, kind) in enumerate((n, k) for n in CONFIGS for k in KINDS):
        model = random_tf_model(name, kind, seed)
        folder = root / f"{name}-{kind}"
        write_pytorch_folder(model, folder)
        models[name, kind] = (model, folder, logits_of(model))
    return models


@pytest.fixture(scope="module")
def config_folders(tmp_path_factory):
    """{how: folder of a config.json written by transformers 4.57}, for transformers 5 to read:
    "legacy", a ModernBertConfig of 4.57's fields only, saved as 4.57 saves it; "writer",
    save_transformers5_config() of what 4.57 made of a transformers 5 file (its thetas 4.57's
    defaults, layer_types and rope_parameters kept as plain attributes)."""
    from transformers import ModernBertConfig

    root = tmp_path_factory.mktemp("configs")
    ModernBertConfig(**CONFIGS["biases"]).save_pretrained(str(root / "legacy"))
    stale = ModernBertConfig(
        **{k: v for k, v in CONFIGS["no_biases"].items() if not k.endswith("rope_theta")},
        rope_parameters={
            FULL: {"rope_type": "default", "rope_theta": 500.0},
            SLIDING: {"rope_type": "default", "rope_theta": 25.0},
        },
    )
    config_files.save_transformers5_config(stale, str(root / "writer"))
    return {"legacy": root / "legacy", "writer": root / "writer"}


@pytest.fixture(scope="module")
def transformers5(transformers5_python, exported, config_folders, tmp_path_factory):
    """transformers 5's report, and {(config name, kind): the folder of the PyTorch model it made},
    the long masked LM's as ("long", "masked_lm"); one subprocess for both directions."""
    root = tmp_path_factory.mktemp("from-pytorch")
    built = {(name, kind): root / f"{name}-{kind}" for name in CONFIGS for kind in KINDS}
    input_ids, attention_mask = batch()
    long_ids, long_mask = long_batch()
    built["long", "masked_lm"] = root / "long-masked_lm"
    long_entry = {
        "folder": str(built["long", "masked_lm"]),
        "kind": "masked_lm",
        "config": LONG,
        "seed": len(built),
        "input_ids": long_ids.tolist(),
        "attention_mask": long_mask.tolist(),
    }
    request = {
        "input_ids": input_ids.tolist(),
        "attention_mask": attention_mask.tolist(),
        "build": [
            {"folder": str(built[name, kind]), "kind": kind, "config": CONFIGS[name], "seed": seed}
            for seed, (name, kind) in enumerate((n, k) for n in CONFIGS for k in KINDS)
        ]
        + [long_entry],
        "load": [
            {"folder": str(folder), "kind": kind} for (_, kind), (_, folder, _) in exported.items()
        ],
        "configs": [str(folder) for folder in config_folders.values()],
    }
    request_path, report_path = root / "request.json", root / "report.json"
    request_path.write_text(json.dumps(request))
    report = run_in_transformers5(TRANSFORMERS5_SCRIPT, request_path, report_path, "ModernBERT")
    return report, built


def imported_model(kind, folder):
    """The TF model of a transformers 5 folder as the pipeline makes it: its config as 4.57's
    AutoConfig reads it (pretrained_model.load_config), weights by assign_pytorch_weights()."""
    from transformers import (
        AutoConfig,
        TFAutoModelForMaskedLM,
        TFAutoModelForSequenceClassification,
    )

    from mlm_pipeline import pytorch_weights

    auto_class = {
        "masked_lm": TFAutoModelForMaskedLM,
        "classifier": TFAutoModelForSequenceClassification,
    }[kind]
    model = auto_class.from_config(AutoConfig.from_pretrained(str(folder)))
    model.build_in_name_scope()
    files = [str(folder / "model.safetensors")]
    assert pytorch_weights.assign_pytorch_weights(model, files, str(folder)) == []
    # and nothing in the file is left over: the names map one to one
    from safetensors import safe_open

    with safe_open(files[0], framework="numpy") as file:
        assert sorted(file.keys()) == sorted(pytorch_weights.pytorch_state_dict(model))
    return model


def pytorch_logits(folder):
    return np.load(folder / "transformers5_logits.npy")


def test_transformers5_versions(transformers5):
    report, _ = transformers5
    assert report["transformers_version"].startswith("5."), report["transformers_version"]


@pytest.mark.parametrize("name", CONFIGS)
def test_imported_masked_lm_matches_pytorch(name, transformers5, attention_path):
    import tensorflow as tf

    _, built = transformers5
    folder = built[name, "masked_lm"]
    model = imported_model("masked_lm", folder)
    expected = pytorch_logits(folder)
    # every position, padded ones included: they average the same keys as in eager PyTorch
    np.testing.assert_allclose(logits_of(model), expected, rtol=RTOL, atol=ATOL)

    # run_mlm.py's sparse head: the encoder, the masked positions, get_lm_head()
    input_ids, attention_mask = batch()
    encoder = getattr(model, model.base_model_prefix)
    hidden = encoder(input_ids=input_ids, attention_mask=attention_mask, training=False)[0]
    gathered = tf.gather(hidden, POSITIONS, batch_dims=1)
    sparse = model.get_lm_head()(gathered).numpy()
    np.testing.assert_allclose(
        sparse,
        np.take_along_axis(expected, np.array(POSITIONS)[..., None], 1),
        rtol=RTOL,
        atol=ATOL,
    )
    # as run_mlm.py calls it, without attention_mask: the unpadded row is the same
    unmasked = encoder(input_ids=input_ids[:1], training=False)[0]
    logits = model.get_lm_head()(unmasked).numpy()
    np.testing.assert_allclose(logits[0], expected[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", CONFIGS)
def test_run_mlm_heads_score_the_same_logits(name, exported):
    """run_mlm.py's trainer (masked_lm_model.MaskedLMTrainer), whose sparse head goes through the
    encoder and get_lm_head() and whose full head through the masked LM, on an unpadded sequence
    (it passes no attention mask)."""
    from mlm_pipeline import masked_lm_model
    from mlm_pipeline.contract import FEATURE_NAME

    model, _, logits = exported[name, "masked_lm"]
    features = {FEATURE_NAME: batch()[0][:1], "masked_positions": np.array(POSITIONS[:1])}
    expected = logits[:1, POSITIONS[0]]
    for mlm_head in ("sparse", "full"):
        trainer = masked_lm_model.MaskedLMTrainer(model, mlm_head, mask_token_id=3)
        found = trainer(features, training=False).numpy()
        np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-5, err_msg=mlm_head)


@pytest.mark.parametrize("name", CONFIGS)
def test_imported_encoder_matches_pytorch(name, transformers5):
    """TFModernBertModel (names model.*, as in the masked LM's file) gives PyTorch's last hidden
    state."""
    from transformers import AutoConfig

    from mlm_pipeline import modernbert, pytorch_weights

    _, built = transformers5
    folder = built[name, "masked_lm"]
    model = modernbert.TFModernBertModel(AutoConfig.from_pretrained(str(folder)))
    model.build_in_name_scope()
    files = [str(folder / "model.safetensors")]
    assert pytorch_weights.assign_pytorch_weights(model, files, name) == []
    input_ids, attention_mask = batch()
    hidden = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    expected = np.load(folder / "transformers5_hidden.npy")
    np.testing.assert_allclose(hidden.numpy(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", CONFIGS)
def test_imported_classifier_matches_pytorch(name, transformers5, attention_path):
    _, built = transformers5
    folder = built[name, "classifier"]
    model = imported_model("classifier", folder)
    assert model.config.classifier_pooling == CONFIGS[name]["classifier_pooling"]
    np.testing.assert_allclose(logits_of(model), pytorch_logits(folder), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", CONFIGS)
def test_exported_model_loads_in_transformers5(name, kind, transformers5, exported):
    report, _ = transformers5
    model, folder, logits = exported[name, kind]
    found = report["load"][str(folder)]
    expected_class = {
        "masked_lm": "ModernBertForMaskedLM",
        "classifier": "ModernBertForSequenceClassification",
    }[kind]
    assert found["model_class"] == expected_class
    assert all(not value for value in found["loading_info"].values()), found["loading_info"]
    if kind == "masked_lm":
        # the file holds the word embeddings once; PyTorch ties its decoder to them
        assert found["shares_word_embeddings"] == model.config.tie_word_embeddings
    np.testing.assert_allclose(pytorch_logits(folder), logits, rtol=RTOL, atol=ATOL)


def test_tied_decoder_owns_only_its_bias(exported):
    """The tied masked LM's weights under PyTorch names are what PyTorch's save_pretrained writes:
    the embeddings once, decoder.bias, no decoder.weight; the untied one has its own."""
    from mlm_pipeline import pytorch_weights

    tied = pytorch_weights.pytorch_state_dict(exported["biases", "masked_lm"][0])
    assert "decoder.bias" in tied and "decoder.weight" not in tied
    assert "model.layers.0.attn_norm.weight" not in tied  # an Identity in PyTorch
    assert tied["model.layers.1.attn.Wqkv.weight"].shape == (96, 32)  # torch's (out, in)
    untied = pytorch_weights.pytorch_state_dict(exported["no_biases", "masked_lm"][0])
    assert untied["decoder.weight"].shape == (61, 32) and "decoder.bias" not in untied
    assert not [name for name in untied if name.endswith(".bias")]


def test_auto_classes_build_it_and_h5_round_trips(exported, tmp_path):
    from transformers import (
        TFAutoModel,
        TFAutoModelForMaskedLM,
        TFAutoModelForSequenceClassification,
    )

    from mlm_pipeline import modernbert

    modernbert.register()  # again: no harm
    for kind, auto_class in (
        ("masked_lm", TFAutoModelForMaskedLM),
        ("classifier", TFAutoModelForSequenceClassification),
    ):
        model, _, logits = exported["biases", kind]
        assert type(auto_class.from_config(model.config)) is model_class(kind)
        model.save_pretrained(str(tmp_path / kind))
        assert (tmp_path / kind / "tf_model.h5").exists()
        loaded = auto_class.from_pretrained(str(tmp_path / kind))
        assert type(loaded) is model_class(kind)
        np.testing.assert_allclose(logits_of(loaded), logits, rtol=1e-6, atol=1e-6)
    encoder = TFAutoModel.from_pretrained(str(tmp_path / "masked_lm"))
    assert type(encoder) is modernbert.TFModernBertModel


@pytest.mark.parametrize("name", CONFIGS)
def test_xla_matches_eager(name, exported):
    import tensorflow as tf

    model, _, logits = exported[name, "masked_lm"]
    input_ids, attention_mask = batch()

    @tf.function(jit_compile=True)
    def full(input_ids, attention_mask):
        return model(input_ids=input_ids, attention_mask=attention_mask).logits

    @tf.function(jit_compile=True)
    def sparse(input_ids, positions):
        hidden = model.model(input_ids=input_ids, training=False)[0]
        return model.get_lm_head()(tf.gather(hidden, positions, batch_dims=1))

    np.testing.assert_allclose(full(input_ids, attention_mask).numpy(), logits, atol=1e-5)
    expected = model.get_lm_head()(
        tf.gather(model.model(input_ids=input_ids)[0], POSITIONS, batch_dims=1)
    )
    found = sparse(tf.constant(input_ids), tf.constant(POSITIONS))
    np.testing.assert_allclose(found.numpy(), expected.numpy(), atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_mixed_bfloat16_runs_close_to_float32(kind, exported, attention_path):
    import tensorflow as tf
    import tf_keras

    model, _, logits = exported["biases", kind]
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        mixed = model_class(kind)(model.config)
        mixed.build_in_name_scope()
        mixed.set_weights(model.get_weights())
        assert all(weight.dtype == tf.float32 for weight in mixed.weights)
        found = mixed(input_ids=batch()[0], attention_mask=batch()[1]).logits
        jitted = tf.function(lambda ids: mixed(input_ids=ids).logits, jit_compile=True)
        jitted(batch()[0])
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
    assert found.dtype == tf.bfloat16
    found = tf.cast(found, tf.float32).numpy()
    assert np.isfinite(found).all()
    # bfloat16 keeps 8 bits of mantissa: a few hundredths of the logits' scale
    scale = np.abs(logits).max()
    np.testing.assert_allclose(found, logits, atol=0.05 * scale)


def test_8192_tokens_match_pytorch(transformers5):
    """At 8,192 tokens (head size 64, window 128, the last 2,192 padding) the switch takes the
    memory-linear path for both layer types, and the logits are transformers 5's, eager and under
    XLA; no tensor the traced forward and backward passes make is near sequence x sequence."""
    import tensorflow as tf

    from mlm_pipeline import modernbert

    assert LONG_LENGTH > modernbert.DENSE_ATTENTION_UP_TO
    _, built = transformers5
    folder = built["long", "masked_lm"]
    model = imported_model("masked_lm", folder)
    input_ids, attention_mask = long_batch()
    expected = pytorch_logits(folder)
    found = model(input_ids=input_ids, attention_mask=attention_mask).logits.numpy()
    np.testing.assert_allclose(found, expected, rtol=RTOL, atol=ATOL)

    @tf.function(jit_compile=True)
    def jitted(input_ids, attention_mask):
        return model(input_ids=input_ids, attention_mask=attention_mask).logits

    found = jitted(tf.constant(input_ids), tf.constant(attention_mask)).numpy()
    np.testing.assert_allclose(found, expected, rtol=RTOL, atol=ATOL)

    @tf.function
    def training_step(input_ids, attention_mask):
        with tf.GradientTape() as tape:
            logits = model(input_ids=input_ids, attention_mask=attention_mask, training=True)
            loss = tf.reduce_mean(logits.logits)
        return tape.gradient(loss, model.trainable_weights)

    spec = tf.TensorSpec([1, LONG_LENGTH], tf.int32)
    graph = training_step.get_concrete_function(spec, spec).graph
    largest = max(
        output.shape.num_elements() or 0
        for operation in graph.get_operations()
        for output in operation.outputs
    )
    # a global chunk's scores are 256 x 8,192; a dense layer's would be 8,192 x 8,192
    assert largest < LONG_LENGTH**2 // 8, largest


def random_attention_inputs(rng, lengths, length, heads=2, head_size=8):
    """Queries, keys, values [len(lengths), heads, length, head size] and a padding mask."""
    import tensorflow as tf

    shape = [len(lengths), heads, length, head_size]
    tensors = [tf.constant(rng.standard_normal(shape).astype(np.float32)) for _ in range(3)]
    mask = (np.arange(length)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    return tensors, mask


@pytest.mark.parametrize("jit_compile", (False, True))
def test_memory_linear_paths_equal_dense(jit_compile):
    """Blocks of a local layer and query chunks of a global one give the dense attention's output
    and gradients, at lengths that are no multiple of a block or a chunk, and windows wider than
    the sequence; eager and under XLA. A query with no key in its window (padding far from any
    token) gets the average of all values, as from the dense path; the gradients are compared where
    every query has a key (the dense path also sends gradient through a softmax masked whole)."""
    import tensorflow as tf

    from mlm_pipeline import modernbert

    def unchanged(probabilities):
        return probabilities

    @tf.function(jit_compile=jit_compile)
    def both_paths(query, key, value, mask, weights, half_window, chunk):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([query, key, value])
            local_bias = modernbert.dense_bias(mask, query.shape[2], half_window)
            global_bias = modernbert.dense_bias(mask, query.shape[2], None)
            contexts = [
                modernbert.attend(query, key, value, local_bias, unchanged),
                modernbert.local_attention_in_blocks(
                    query, key, value, mask, half_window, unchanged
                ),
                modernbert.attend(query, key, value, global_bias, unchanged),
                modernbert.global_attention_in_chunks(query, key, value, mask, 0.0, [0, 0], chunk),
            ]
            losses = [tf.reduce_sum(context * weights) for context in contexts]
        gradients = [tape.gradient(loss, [query, key, value]) for loss in losses]
        return contexts, gradients

    cases = [
        ((100, 40), 100, 7, 32, False),
        ((100, 95), 100, 7, 32, True),
        ((24, 17, 5), 24, 4, 5, False),
        ((24, 21, 22), 24, 4, 7, True),
        ((10,), 10, 64, 4, True),  # a window wider than the sequence: one block
        ((30, 20), 30, 0, 64, False),  # each token its own only
    ]
    rng = np.random.default_rng(0)
    # XLA compiles each case anew: two of them show it the same
    for lengths, length, half_window, chunk, every_query_has_a_key in cases[
        : 2 if jit_compile else None
    ]:
        (query, key, value), mask = random_attention_inputs(rng, lengths, length)
        weights = tf.constant(rng.standard_normal(query.shape).astype(np.float32))
        contexts, gradients = both_paths(query, key, value, mask, weights, half_window, chunk)
        case = (lengths, half_window, chunk)
        for dense, memory_linear in (contexts[:2], contexts[2:]):
            np.testing.assert_allclose(memory_linear, dense, atol=1e-6, err_msg=str(case))
        pairs = [gradients[2:]] + ([gradients[:2]] if every_query_has_a_key else [])
        for dense, memory_linear in pairs:
            for wanted, found in zip(dense, memory_linear):
                np.testing.assert_allclose(found, wanted, atol=1e-5, err_msg=str(case))


@pytest.mark.parametrize("jit_compile", (False, True))
def test_geglu_keeps_its_inputs_and_gives_tfs_own_gradients(jit_compile):
    """gelu_times_gate, the GeGLU whose backward pass keeps only its two inputs, gives the output
    and gradients of TF's own gelu(inputs) * gate, eager and under XLA, in float32 and in bfloat16
    (mixed precision's compute dtype), over the inputs where the erf saturates too. The MLP takes
    it for ModernBERT's exact GELU, under either of its names, and not for the tanh one."""
    import tensorflow as tf
    from transformers import ModernBertConfig

    from mlm_pipeline import modernbert

    gelu = modernbert.activation("gelu")

    @tf.function(jit_compile=jit_compile)
    def both(inputs, gate, weights):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([inputs, gate])
            outputs = [modernbert.gelu_times_gate(inputs, gate), gelu(inputs) * gate]
            losses = [tf.reduce_sum(tf.cast(output, tf.float32) * weights) for output in outputs]
        return outputs, [tape.gradient(loss, [inputs, gate]) for loss in losses]

    rng = np.random.default_rng(0)
    inputs, gate, weights = (rng.standard_normal([3, 5, 64]).astype(np.float32) for _ in range(3))
    inputs[0, 0] = np.linspace(-9, 9, 64)  # the tails, where the normal's cdf is 0 or 1
    for dtype, tolerance in ((tf.float32, 1e-6), (tf.bfloat16, 1e-2)):
        (fused, plain), (fused_gradients, plain_gradients) = both(
            tf.cast(inputs, dtype), tf.cast(gate, dtype), tf.constant(weights)
        )
        assert fused.dtype == dtype and fused_gradients[0].dtype == dtype
        for found, wanted in zip([fused, *fused_gradients], [plain, *plain_gradients]):
            found, wanted = (tf.cast(tensor, tf.float32).numpy() for tensor in (found, wanted))
            np.testing.assert_allclose(found, wanted, rtol=tolerance, atol=tolerance)
    for name, exact in (("gelu", True), ("gelu_python", True), ("gelu_pytorch_tanh", False)):
        mlp = modernbert.TFModernBertMLP(ModernBertConfig(hidden_activation=name))
        assert mlp.exact_gelu == exact, name


def test_global_chunks_recompute_their_dropout():
    """Dropout in a chunked global layer is drawn from the chunk's seed, so the backward pass's
    recomputation drops what the forward pass dropped: the gradients are those of the same chunks
    attended without recomputation, with the same masks."""
    import tensorflow as tf

    from mlm_pipeline import modernbert

    rng = np.random.default_rng(2)
    (query, key, value), mask = random_attention_inputs(rng, (20, 13), 20)
    rate, seed, chunk = 0.4, tf.constant([7, 11]), 8
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([query, key, value])
        found = modernbert.global_attention_in_chunks(query, key, value, mask, rate, seed, chunk)
        bias = modernbert.dense_bias(mask, 20, None)
        padded = tf.pad(query, [[0, 0], [0, 0], [0, 4], [0, 0]])
        expected = []
        for index in range(3):
            chunk_seed = tf.stack([seed[0], seed[1] + index])

            def dropout(probabilities, chunk_seed=chunk_seed):
                kept = tf.random.stateless_uniform(tf.shape(probabilities), chunk_seed) >= rate
                return tf.where(kept, probabilities / (1 - rate), 0.0)

            rows = padded[:, :, index * chunk : (index + 1) * chunk]
            expected.append(modernbert.attend(rows, key, value, bias, dropout))
        expected = tf.concat(expected, axis=2)[:, :, :20]
        loss_found, loss_expected = tf.reduce_sum(found**2), tf.reduce_sum(expected**2)
    np.testing.assert_allclose(found, expected, atol=1e-6)
    undropped = modernbert.global_attention_in_chunks(query, key, value, mask, 0.0, seed, chunk)
    assert np.abs(found - undropped).max() > 1e-2  # the dropout did drop
    for wanted, got in zip(
        tape.gradient(loss_expected, [query, key, value]),
        tape.gradient(loss_found, [query, key, value]),
    ):
        np.testing.assert_allclose(got, wanted, atol=1e-5)


def test_models_leave_their_callers_config_alone():
    """A model reads a copy of its config in both spellings; the config it was given is unchanged
    (a transformers 5 layout, its 4.57 thetas stale, stays so)."""
    from transformers import ModernBertConfig

    from mlm_pipeline import modernbert

    config = ModernBertConfig(
        **{k: v for k, v in CONFIGS["no_biases"].items() if not k.endswith("rope_theta")},
        rope_parameters={
            FULL: {"rope_type": "default", "rope_theta": 500.0},
            SLIDING: {"rope_type": "default", "rope_theta": 25.0},
        },
    )
    before = config.to_dict()
    model = modernbert.TFModernBertForMaskedLM(config)
    assert config.to_dict() == before and config.global_rope_theta == 160000.0
    for read in (model.config, model.model.config):
        assert (read.global_rope_theta, read.local_rope_theta) == (500.0, 25.0)
    assert model.model.rope_thetas == {FULL: 500.0, SLIDING: 25.0}


def test_transformers5_config_reads_right_in_transformers457(transformers5):
    """A config.json saved by transformers 5 holds layer_types and rope_parameters, not
    global_rope_theta and local_rope_theta: transformers 4.57 reads its own defaults for those.
    config_from_dict() (and every model, when built) takes what transformers 5 reads."""
    from transformers import AutoConfig

    from mlm_pipeline import modernbert, modernbert_config

    report, built = transformers5
    for name in CONFIGS:
        folder = built[name, "masked_lm"]
        saved = json.loads((folder / "config.json").read_text())
        assert "global_rope_theta" not in saved and "rope_parameters" in saved
        reading = report["build"][str(folder)]
        plain = AutoConfig.from_pretrained(str(folder))
        assert (plain.global_rope_theta, plain.local_rope_theta) == (160000.0, 10000.0)
        for config in (config_files.config_from_dict(saved), config_files.load_config(folder)):
            layer_types, thetas = modernbert_config.attention_layout(config)
            assert layer_types == reading["layer_types"]
            assert thetas == reading["rope_thetas"]
            assert config.global_rope_theta == CONFIGS[name]["global_rope_theta"]
            assert config.local_rope_theta == CONFIGS[name]["local_rope_theta"]
        if "global_attn_every_n_layers" in CONFIGS[name]:
            assert config.global_attn_every_n_layers == CONFIGS[name]["global_attn_every_n_layers"]
        # a model built from the plain reading reads it as transformers 5 does
        model = modernbert.TFModernBertModel(plain)
        assert model.model.rope_thetas == reading["rope_thetas"]
        assert model.model.layer_types == reading["layer_types"]


def test_transformers457_config_reads_right_in_transformers5(
    transformers5, exported, config_folders
):
    """What the TF side writes (a model's config.save_pretrained(), as pytorch_weights.py does; a
    ModernBertConfig of 4.57's fields alone; save_transformers5_config() of a config with stale
    4.57 fields) means the same to transformers 5."""
    from transformers import ModernBertConfig

    from mlm_pipeline import modernbert_config

    report, _ = transformers5
    cases = [(model.config, report["load"][str(folder)]) for model, folder, _ in exported.values()]
    legacy = ModernBertConfig(**CONFIGS["biases"])
    cases.append((legacy, report["configs"][str(config_folders["legacy"])]))
    writer = json.loads((config_folders["writer"] / "config.json").read_text())
    assert (writer["global_rope_theta"], writer["local_rope_theta"]) == (500.0, 25.0)
    cases.append(
        (ModernBertConfig(**CONFIGS["no_biases"]), report["configs"][str(config_folders["writer"])])
    )
    for config, reading in cases:
        layer_types, thetas = modernbert_config.attention_layout(config)
        assert reading["layer_types"] == layer_types
        assert reading["rope_thetas"] == thetas
        assert reading["local_attention"] == config.local_attention
        assert reading["tie_word_embeddings"] == config.tie_word_embeddings


def test_dropout_only_when_training(exported):
    """Each dropout (embedding, attention, MLP, classifier) is off at training=False, where the
    model gives the dropout-free logits, and on at training=True."""
    from mlm_pipeline import modernbert_config

    for kind, rate_name in (
        ("masked_lm", "embedding_dropout"),
        ("masked_lm", "attention_dropout"),
        ("masked_lm", "mlp_dropout"),
        ("classifier", "classifier_dropout"),
    ):
        model, _, logits = exported["biases", kind]
        config = model.config.__class__.from_dict({**model.config.to_dict(), rate_name: 0.5})
        dropping = model_class(kind)(modernbert_config.normalize_config(config))
        dropping.build_in_name_scope()
        dropping.set_weights(model.get_weights())
        np.testing.assert_allclose(logits_of(dropping), logits, rtol=1e-6, atol=1e-6)
        trained = logits_of(dropping, training=True)
        assert np.abs(trained - logits).max() > 1e-3, rate_name


@pytest.mark.parametrize("kind", KINDS)
def test_outputs_come_as_transformers_tf_models_give_them(kind, exported):
    """A ModelOutput, or with return_dict off a tuple: (loss,) logits (, hidden states), the loss
    there only with labels and the hidden states only when asked for (the embeddings' and each
    layer's, the last after the final norm)."""
    model, _, logits = exported["biases", kind]
    input_ids, attention_mask = batch()
    labels = input_ids if kind == "masked_lm" else np.arange(len(input_ids)) % 2
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    whole = model(**inputs, labels=labels, output_hidden_states=True)
    layers = model.config.num_hidden_layers
    assert len(whole.hidden_states) == layers + 1
    for extra, expected in (
        ({}, [logits]),
        ({"labels": labels}, [whole.loss, logits]),
        ({"output_hidden_states": True}, [logits, whole.hidden_states]),
        (
            {"labels": labels, "output_hidden_states": True},
            [whole.loss, logits, whole.hidden_states],
        ),
    ):
        output = model(**inputs, **extra, return_dict=False)
        assert isinstance(output, tuple) and len(output) == len(expected), extra
        for got, wanted in zip(output, expected):
            np.testing.assert_allclose(np.asarray(got), np.asarray(wanted), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(whole.logits.numpy(), logits, rtol=1e-6, atol=1e-6)
    assert model(**inputs).hidden_states is None and model(**inputs).loss is None


def test_initialization_follows_modernbert():
    """Truncated normals at ModernBERT's scales: initializer_range for embeddings, Wqkv and Wi;
    divided by sqrt(2 x layers) for the projections back into the residual stream; hidden**-0.5 for
    the classifier; cut at initializer_cutoff_factor standard deviations; norms 1, biases 0."""
    import tensorflow as tf
    from transformers import ModernBertConfig

    from mlm_pipeline import modernbert

    tf.random.set_seed(0)
    config = ModernBertConfig(**{**CONFIGS["biases"], "hidden_size": 64, "num_labels": 64})
    model = modernbert.TFModernBertForSequenceClassification(config)
    model.build_in_name_scope()
    weights = {weight.name.split("/", 1)[1]: weight.numpy() for weight in model.weights}
    std_in = config.initializer_range
    std_out = std_in / np.sqrt(2.0 * config.num_hidden_layers)
    expected = {
        "model/embeddings/tok_embeddings/weight:0": std_in,
        "model/layers_._1/attn/Wqkv/kernel:0": std_in,
        "model/layers_._1/mlp/Wi/kernel:0": std_in,
        "model/layers_._1/attn/Wo/kernel:0": std_out,
        "model/layers_._1/mlp/Wo/kernel:0": std_out,
        "head/dense/kernel:0": std_out,
        "classifier/kernel:0": 64**-0.5,
    }
    # the standard deviation of a normal cut at +-2 standard deviations
    cut = 0.8796
    for name, std in expected.items():
        values = weights[name]
        assert np.abs(values).max() <= 2 * std + 1e-7, name
        assert abs(values.std() / (cut * std) - 1) < 0.1, (name, values.std(), cut * std)
    for name, values in weights.items():
        if name.endswith(("gamma:0", "beta:0", "bias:0")):
            assert np.all(values == (1.0 if name.endswith("gamma:0") else 0.0)), name


def test_configs_it_cannot_run_are_refused():
    """A RoPE variant other than plain, or layer_types that do not fit the layers, would give a
    model that differs from transformers 5's without a word."""
    from transformers import ModernBertConfig

    from mlm_pipeline import modernbert, modernbert_config

    scaled = ModernBertConfig(
        **CONFIGS["biases"],
        rope_parameters={FULL: {"rope_type": "linear", "factor": 2.0, "rope_theta": 10.0}},
    )
    with pytest.raises(NotImplementedError, match="linear"):
        modernbert.TFModernBertModel(scaled)
    short = ModernBertConfig(**{**CONFIGS["no_biases"], "layer_types": [FULL, SLIDING]})
    with pytest.raises(ValueError, match="2 layer_types for 5 layers"):
        modernbert.TFModernBertModel(short)
    assert modernbert_config.global_layer_period([FULL, SLIDING, SLIDING, FULL]) == 3
    assert modernbert_config.global_layer_period([FULL, FULL], preferred=1) == 1
    assert modernbert_config.global_layer_period([FULL, SLIDING, FULL, FULL, SLIDING]) is None


def test_legacy_layout_after_a_change(transformers5):
    """A config read from a transformers 5 file, then changed through the 4.57 fields (as
    --config_overrides would): use_legacy_layout() lets the change count."""
    from mlm_pipeline import modernbert_config

    _, built = transformers5
    config = config_files.load_config(built["biases", "masked_lm"])
    config.global_rope_theta, config.num_hidden_layers = 7.0, 7
    config.global_attn_every_n_layers = 2
    with pytest.raises(ValueError, match="4 layer_types for 7 layers"):
        modernbert_config.attention_layout(config)
    modernbert_config.use_legacy_layout(config)
    layer_types, thetas = modernbert_config.attention_layout(config)
    assert layer_types == [FULL, SLIDING, FULL, SLIDING, FULL, SLIDING, FULL]
    assert thetas == {FULL: 7.0, SLIDING: CONFIGS["biases"]["local_rope_theta"]}
    assert "layer_types" not in config.to_dict()
