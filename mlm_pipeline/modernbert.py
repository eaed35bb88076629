"""ModernBERT in TensorFlow (tf_keras), a twin of transformers 5's PyTorch ModernBERT.

transformers 4.57, the last line with TF models, has ModernBERT in PyTorch only. Its
`ModernBertConfig` drives these classes (read as transformers 5 reads it: modernbert_config.py),
and every TF variable is named so that transformers' `convert_tf_weight_name_to_pt_weight_name`
(pytorch_weights.py uses it both ways, unchanged) gives the PyTorch state-dict name:
`model.layers.1.attn.Wqkv.weight` is the TF variable `.../model/layers_._1/attn/Wqkv/kernel:0`.

The architecture, as transformers 5 runs it with padded batches (no unpadding, static shapes, so
XLA compiles it): token embeddings (no position embeddings) and a LayerNorm; pre-norm layers whose
attention rotates queries and keys (RoPE), global layers over the whole sequence and local ones
over a band of `local_attention // 2` tokens each side; a GeGLU MLP; a final LayerNorm. Heads: a
dense-activation-norm head, then the decoder (the word embeddings when tied) or a classifier.
"""

import copy
import math

import numpy as np
import tensorflow as tf
import tf_keras
from transformers import (
    ModernBertConfig,
    TFAutoModel,
    TFAutoModelForMaskedLM,
    TFAutoModelForSequenceClassification,
)
from transformers.activations_tf import get_tf_activation
from transformers.modeling_tf_outputs import (
    TFBaseModelOutput,
    TFMaskedLMOutput,
    TFSequenceClassifierOutput,
)
from transformers.modeling_tf_utils import (
    TFMaskedLanguageModelingLoss,
    TFPreTrainedModel,
    TFSequenceClassificationLoss,
    keras_serializable,
    unpack_inputs,
)
from transformers.tf_utils import check_embeddings_within_bounds, shape_list

from .modernbert_config import SLIDING_ATTENTION, attention_layout, normalize_config, sliding_window

# PyTorch activation names transformers' TF side spells otherwise (the same functions)
ACTIVATION_ALIASES = {
    "gelu_python": "gelu",
    "gelu_pytorch_tanh": "gelu_new",
    "gelu_python_tanh": "gelu_new",
}


# Initialization, as transformers' ModernBERT _init_weights: runs here train from random weights.


class TruncatedNormal(tf_keras.initializers.Initializer):
    """A normal of standard deviation `stddev` cut at `cutoff` standard deviations, drawn by the
    inverse CDF as torch's trunc_normal_ draws it (Keras' own cuts at 2 always)."""

    def __init__(self, stddev, cutoff):
        self.stddev, self.cutoff = float(stddev), float(cutoff)

    def __call__(self, shape, dtype=None, **kwargs):
        dtype = tf.as_dtype(dtype or tf_keras.backend.floatx())
        low, high = (0.5 * (1.0 + math.erf(s * self.cutoff / math.sqrt(2.0))) for s in (-1, 1))
        uniform = tf.random.uniform(shape, 2.0 * low - 1.0, 2.0 * high - 1.0, dtype=tf.float32)
        values = math.sqrt(2.0) * self.stddev * tf.math.erfinv(uniform)
        limit = self.cutoff * self.stddev
        return tf.cast(tf.clip_by_value(values, -limit, limit), dtype)

    def get_config(self):
        return {"stddev": self.stddev, "cutoff": self.cutoff}


def initializer(config, kind):
    """The initializer ModernBERT gives a weight of `kind`: "in" (embeddings, Wqkv, Wi), "out"
    (the projections back into the residual stream, scaled down by depth; the heads' dense; an
    untied decoder) or "final_out" (the classifier)."""
    stddevs = {
        "in": config.initializer_range,
        "out": config.initializer_range / math.sqrt(2.0 * config.num_hidden_layers),
        "final_out": config.hidden_size**-0.5,
    }
    cutoff = config.initializer_cutoff_factor
    return TruncatedNormal(stddevs[kind], 3.0 if cutoff is None else cutoff)


def activation(name):
    """The TF function for a PyTorch activation name (ACT2FN's)."""
    if name == "linear":
        return tf.identity
    return get_tf_activation(ACTIVATION_ALIASES.get(name, name))


def layer_norm(config, name):
    """PyTorch's LayerNorm(bias=norm_bias). tf_keras computes it in float32 under mixed
    precision."""
    return tf_keras.layers.LayerNormalization(
        epsilon=config.norm_eps, center=config.norm_bias, name=name
    )


def dense(config, units, use_bias, kind, name):
    return tf_keras.layers.Dense(
        units, use_bias=use_bias, kernel_initializer=initializer(config, kind), name=name
    )


# The layers. Each build() builds its sublayers under their own names, as transformers' TF models
# do, so that the variable names are fixed whatever first calls the model. Sublayers keep
# PyTorch's attribute names (Wqkv, Wo, Wi): they are the names the weights are found by.


class TFModernBertEmbeddings(tf_keras.layers.Layer):
    """Token embeddings (`tok_embeddings.weight`), LayerNorm (`norm`), dropout."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.norm = layer_norm(config, "norm")
        self.dropout = tf_keras.layers.Dropout(config.embedding_dropout)

    def build(self, input_shape=None):
        if self.built:
            return
        self.built = True
        with tf.name_scope("tok_embeddings"):
            self.weight = self.add_weight(
                name="weight",
                shape=[self.config.vocab_size, self.config.hidden_size],
                initializer=initializer(self.config, "in"),
            )
        with tf.name_scope(self.norm.name):
            self.norm.build([None, None, self.config.hidden_size])

    def call(self, input_ids=None, inputs_embeds=None, training=False):
        if inputs_embeds is None:
            check_embeddings_within_bounds(input_ids, self.config.vocab_size)
            inputs_embeds = tf.gather(self.weight, input_ids)
        return self.dropout(self.norm(inputs_embeds), training=training)


@tf.custom_gradient
def gelu_times_gate(inputs, gate):
    """gelu(inputs) * gate with the exact GELU, as transformers' TF "gelu", keeping its two inputs
    alone for the backward pass, which recomputes the rest. TF's own gradient would keep three
    more tensors of the same size (inputs / sqrt 2 for the erf, the normal's cdf, the GELU), three
    a layer that a long sequence cannot spare (BENCHMARKS.md, "ModernBERT at long sequences")."""
    gelu = activation("gelu")

    def gradient(upstream):
        cdf = 0.5 * tf.math.erfc(-inputs * 0.5**0.5)  # erfc: no cancellation in the left tail
        density = tf.exp(-0.5 * tf.square(inputs)) * (2.0 * math.pi) ** -0.5
        # gelu(x) = x cdf(x), so its derivative is cdf(x) + x density(x)
        return upstream * gate * (cdf + inputs * density), upstream * inputs * cdf

    return gelu(inputs) * gate, gradient


class TFModernBertMLP(tf_keras.layers.Layer):
    """GeGLU: Wi to twice the intermediate size, split into input and gate, act(input) * gate,
    dropout, Wo."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.Wi = dense(config, 2 * config.intermediate_size, config.mlp_bias, "in", "Wi")
        self.activation = activation(config.hidden_activation)
        name = ACTIVATION_ALIASES.get(config.hidden_activation, config.hidden_activation)
        self.exact_gelu = name == "gelu"  # ModernBERT's: the backward pass's memory is cut
        self.dropout = tf_keras.layers.Dropout(config.mlp_dropout)
        self.Wo = dense(config, config.hidden_size, config.mlp_bias, "out", "Wo")

    def build(self, input_shape=None):
        if self.built:
            return
        self.built = True
        with tf.name_scope(self.Wi.name):
            self.Wi.build([None, None, self.config.hidden_size])
        with tf.name_scope(self.Wo.name):
            self.Wo.build([None, None, self.config.intermediate_size])

    def call(self, hidden_states, training=False):
        inputs, gate = tf.split(self.Wi(hidden_states), 2, axis=-1)
        if self.exact_gelu:
            gated = gelu_times_gate(inputs, gate)
        else:
            gated = self.activation(inputs) * gate
        return self.Wo(self.dropout(gated, training=training))


def rotate_half(tensor):
    first, second = tf.split(tensor, 2, axis=-1)
    return tf.concat([-second, first], axis=-1)


def apply_rotary(tensor, cos, sin):
    """RoPE in float32, whatever the compute dtype, as transformers 5 applies it."""
    rotated = tf.cast(tensor, tf.float32)
    rotated = rotated * cos + rotate_half(rotated) * sin
    return tf.cast(rotated, tensor.dtype)


def rotary_tables(theta, head_size, length):
    """cos and sin [length, head_size] in float32 for positions 0 .. length - 1."""
    exponents = np.arange(0, head_size, 2, dtype=np.float32) / np.float32(head_size)
    inverse_frequencies = tf.constant(1.0 / np.power(np.float32(theta), exponents), tf.float32)
    positions = tf.cast(tf.range(length), tf.float32)
    frequencies = positions[:, None] * inverse_frequencies[None, :]
    angles = tf.concat([frequencies, frequencies], axis=-1)
    return tf.cos(angles), tf.sin(angles)


# The attention. At the lengths the recipe trains (128 tokens) a layer scores every query against
# every key at once, the fastest way there. Past a length measured on the CPU (BENCHMARKS.md,
# "ModernBERT at long sequences") no tensor of sequence x sequence is made: a local layer attends
# block by block, a global one chunk of queries by chunk, recomputed in the backward pass, so that
# training memory grows with the length, not its square. The path is chosen from the static length
# the layer is traced with (fixed by run_mlm.py's shards); an unknown length takes the dense path.

# The longest sequence attended densely, by a layer of either type. Measured on the CPU (one layer's
# attention, forward and backward, the same tokens at each length): a local layer's blocks are
# faster from 1,024 tokens; a global layer's chunks cost 1.2x to 1.4x the dense path up to 4,096
# (each chunk's scores computed twice), which past 512 buys memory that grows with the length.
DENSE_ATTENTION_UP_TO = 512
# Queries a global layer scores at once past it: scores [batch, heads, 256, length] a chunk
GLOBAL_QUERY_CHUNK = 256


def attend(query, key, value, bias, dropout):
    """softmax(query key^T / sqrt(head size) + bias) value over the last two axes: the scores in
    the compute dtype, the softmax in float32 (bfloat16 has too few bits for the mask's large
    negative value), `dropout` on the probabilities."""
    scores = tf.matmul(query, key, transpose_b=True) * tf.cast(query.shape[-1] ** -0.5, query.dtype)
    probabilities = tf.nn.softmax(tf.cast(scores, tf.float32) + bias, axis=-1)
    return tf.matmul(dropout(tf.cast(probabilities, value.dtype)), value)


def dense_bias(attention_mask, length, half_window):
    """An additive float32 mask [batch, 1, length or 1, length]: 0 where a query may attend,
    float32's lowest value where not. A query attends to the unpadded keys; in a local layer
    (`half_window` not None) only to those at most `half_window` positions away (transformers 5's
    sliding window, and-ed with the padding). A query with no key left (padding far from any token)
    gets the uniform average of all values, as in transformers 5's eager attention."""
    allowed = tf.cast(attention_mask, tf.bool)[:, None, None, :]
    if half_window is not None:
        positions = tf.range(length)
        band = tf.abs(positions[:, None] - positions[None, :]) <= half_window
        allowed = allowed & band[None, None]
    return tf.where(allowed, 0.0, tf.float32.min)


def local_attention_in_blocks(query, key, value, attention_mask, half_window, dropout):
    """A local layer's attention in O(length x window), equal to attend() with dense_bias().

    The sequence (padded to whole blocks) is cut into blocks of `half_window` queries; a query in
    block b sees at most `half_window` positions each side, all inside blocks b - 1, b and b + 1, so
    each block is scored against those 3 x `half_window` keys alone: the scores are [batch, heads,
    blocks, half_window, 3 x half_window], shapes fixed by the length (XLA, TPUs). The band and the
    padding are masked per block; a key outside the sequence counts as padding."""
    batch, heads, length, head_size = shape_list(query)
    block = max(half_window, 1)
    blocks = -(-length // block)
    end = blocks * block - length

    def neighbourhoods(tensor):
        """[..., (blocks + 2) x block, ...] (a block of padding each side) to [..., blocks, 3 x
        block, ...]: each block's own keys and its neighbours'."""
        shape = shape_list(tensor)
        tensor = tf.reshape(tensor, shape[:2] + [blocks + 2, block] + shape[3:])
        return tf.concat([tensor[:, :, :-2], tensor[:, :, 1:-1], tensor[:, :, 2:]], axis=3)

    sides = [[0, 0], [0, 0], [block, end + block], [0, 0]]
    keys, values = neighbourhoods(tf.pad(key, sides)), neighbourhoods(tf.pad(value, sides))
    queries = tf.pad(query, [[0, 0], [0, 0], [0, end], [0, 0]])
    queries = tf.reshape(queries, [batch, heads, blocks, block, head_size])
    unpadded = tf.pad(tf.cast(attention_mask, tf.bool), [[0, 0], [block, end + block]])
    unpadded = neighbourhoods(unpadded[:, None])  # [batch, 1, blocks, 3 x block]
    # query i of a block and key j of its neighbourhood are block + i - j positions apart
    distances = np.arange(block)[:, None] + block - np.arange(3 * block)[None, :]
    allowed = unpadded[:, :, :, None, :] & tf.constant(np.abs(distances) <= half_window)
    bias = tf.where(allowed, 0.0, tf.float32.min)
    context = attend(queries, keys, values, bias, dropout)
    context = tf.reshape(context, [batch, heads, blocks * block, head_size])[:, :, :length]
    # a query with no key in its window: the uniform average of all values, as attend() gives it
    # over a row masked whole (and transformers 5's eager attention)
    has_key = tf.reshape(tf.reduce_any(allowed, axis=-1), [batch, 1, blocks * block])
    average = tf.reduce_mean(tf.cast(value, tf.float32), axis=2, keepdims=True)
    return tf.where(has_key[:, :, :length, None], context, tf.cast(average, context.dtype))


def global_attention_in_chunks(query, key, value, attention_mask, dropout_rate, seed, chunk):
    """A global layer's attention equal to attend() over the whole sequence, `chunk` queries at a
    time (scores [batch, heads, chunk, length]), one chunk after another (a loop that XLA compiles
    as such) and recomputed in the backward pass (tf.recompute_grad), so that neither pass holds
    more than one chunk's scores. Each chunk sees every key at once, so the plain softmax is exact
    and an online one (over chunks of keys too) would only add a loop. Dropout is stateless,
    seeded per chunk from `seed`, so that the recomputation drops what the forward pass dropped."""
    batch, heads, length, head_size = shape_list(query)
    chunks = -(-length // chunk)
    bias = tf.where(tf.cast(attention_mask, tf.bool), 0.0, tf.float32.min)[:, None, None, :]
    queries = tf.pad(query, [[0, 0], [0, 0], [0, chunks * chunk - length], [0, 0]])
    queries = tf.reshape(queries, [batch, heads, chunks, chunk, head_size])
    seeds = tf.stack([tf.fill([chunks], seed[0]), seed[1] + tf.range(chunks)], axis=1)

    def attend_chunk(elements):
        query_chunk, chunk_seed = elements

        def dropout(probabilities):
            if not dropout_rate:
                return probabilities
            kept = tf.random.stateless_uniform(tf.shape(probabilities), chunk_seed) >= dropout_rate
            scale = tf.cast(1.0 / (1.0 - dropout_rate), probabilities.dtype)
            return tf.where(kept, probabilities * scale, tf.zeros_like(probabilities))

        def chunk_context(query_chunk, key, value):
            return attend(query_chunk, key, value, bias, dropout)

        return tf.recompute_grad(chunk_context)(query_chunk, key, value)

    context = tf.map_fn(
        attend_chunk,
        (tf.transpose(queries, [2, 0, 1, 3, 4]), seeds),
        fn_output_signature=query.dtype,
        parallel_iterations=1,  # one chunk's scores at a time, also in the backward loop
    )
    context = tf.reshape(tf.transpose(context, [1, 2, 0, 3, 4]), [batch, heads, -1, head_size])
    return context[:, :, :length]


class TFModernBertAttention(tf_keras.layers.Layer):
    """Self-attention over a padded batch: one Wqkv projection, RoPE on queries and keys, scores
    masked (padding, and the band of a local layer), softmax in float32, dropout on the
    probabilities, Wo, dropout."""

    def __init__(self, config, layer_type, **kwargs):
        super().__init__(**kwargs)
        self.config = config  # its hidden size divides into heads: architecture.load_config checks
        self.head_count = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.half_window = sliding_window(config) if layer_type == SLIDING_ATTENTION else None
        self.Wqkv = dense(config, 3 * config.hidden_size, config.attention_bias, "in", "Wqkv")
        self.Wo = dense(config, config.hidden_size, config.attention_bias, "out", "Wo")
        self.attention_dropout = tf_keras.layers.Dropout(config.attention_dropout)
        self.output_dropout = tf_keras.layers.Dropout(config.attention_dropout)

    def build(self, input_shape=None):
        if self.built:
            return
        self.built = True
        for projection in (self.Wqkv, self.Wo):
            with tf.name_scope(projection.name):
                projection.build([None, None, self.config.hidden_size])

    def call(self, hidden_states, rotary, attention_mask, training=False):
        batch, length = shape_list(hidden_states)[:2]
        qkv = self.Wqkv(hidden_states)
        # PyTorch's layout: [batch, length, (query, key, value), heads, head size]
        qkv = tf.reshape(qkv, [batch, length, 3, self.head_count, self.head_size])
        query, key, value = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]), axis=0)
        cos, sin = rotary
        query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        context = self.attention(query, key, value, attention_mask, training)
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch, length, -1])
        return self.output_dropout(self.Wo(context), training=training)

    def attention(self, query, key, value, attention_mask, training):
        """The context [batch, heads, length, head size] by the path that suits the length."""

        def dropout(probabilities):
            return self.attention_dropout(probabilities, training=training)

        length = query.shape[2]
        if length is None or length <= DENSE_ATTENTION_UP_TO:
            bias = dense_bias(attention_mask, shape_list(query)[2], self.half_window)
            return attend(query, key, value, bias, dropout)
        if self.half_window is not None:
            return local_attention_in_blocks(
                query, key, value, attention_mask, self.half_window, dropout
            )
        rate = self.config.attention_dropout if training else 0.0
        seed = tf.random.uniform([2], maxval=tf.int32.max, dtype=tf.int32) if rate else [0, 0]
        return global_attention_in_chunks(
            query, key, value, attention_mask, rate, seed, GLOBAL_QUERY_CHUNK
        )


class TFModernBertEncoderLayer(tf_keras.layers.Layer):
    """Pre-norm: x + attn(attn_norm(x)), then x + mlp(mlp_norm(x)). Layer 0 has no attn_norm (the
    embeddings' norm precedes it), as in PyTorch, where it is an Identity without weights."""

    def __init__(self, config, layer_index, layer_type, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.attn_norm = layer_norm(config, "attn_norm") if layer_index else None
        self.attn = TFModernBertAttention(config, layer_type, name="attn")
        self.mlp_norm = layer_norm(config, "mlp_norm")
        self.mlp = TFModernBertMLP(config, name="mlp")

    def build(self, input_shape=None):
        if self.built:
            return
        self.built = True
        for layer in (self.attn_norm, self.attn, self.mlp_norm, self.mlp):
            if layer is not None:
                with tf.name_scope(layer.name):
                    layer.build([None, None, self.config.hidden_size])

    def call(self, hidden_states, rotary, attention_mask, training=False):
        normed = hidden_states if self.attn_norm is None else self.attn_norm(hidden_states)
        hidden_states = hidden_states + self.attn(normed, rotary, attention_mask, training=training)
        return hidden_states + self.mlp(self.mlp_norm(hidden_states), training=training)


@keras_serializable
class TFModernBertMainLayer(tf_keras.layers.Layer):
    """The encoder, PyTorch's ModernBertModel: embeddings, layers, final norm."""

    config_class = ModernBertConfig

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        # a copy: the caller's config is left as it was given
        self.config = config = normalize_config(copy.deepcopy(config))
        self.layer_types, self.rope_thetas = attention_layout(config)
        self.head_size = config.hidden_size // config.num_attention_heads
        self.embeddings = TFModernBertEmbeddings(config, name="embeddings")
        # "_._" becomes "." in PyTorch's names: layers_._3 is layers.3
        self.encoder_layers = [
            TFModernBertEncoderLayer(config, index, layer_type, name=f"layers_._{index}")
            for index, layer_type in enumerate(self.layer_types)
        ]
        self.final_norm = layer_norm(config, "final_norm")

    def build(self, input_shape=None):
        if self.built:
            return
        self.built = True
        for layer in (self.embeddings, *self.encoder_layers, self.final_norm):
            with tf.name_scope(layer.name):
                layer.build([None, None, self.config.hidden_size])

    def get_input_embeddings(self):
        return self.embeddings

    @unpack_inputs
    def call(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,  # ModernBERT has none: taken as a tokenizer gives it, and unused
        inputs_embeds=None,
        output_hidden_states=None,
        return_dict=None,
        training=False,
    ):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        hidden_states = self.embeddings(
            input_ids=input_ids, inputs_embeds=inputs_embeds, training=training
        )
        batch, length = shape_list(hidden_states)[:2]
        if attention_mask is None:
            attention_mask = tf.ones([batch, length], tf.int32)
        rotary = {
            layer_type: rotary_tables(theta, self.head_size, length)
            for layer_type, theta in self.rope_thetas.items()
        }
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        for layer, layer_type in zip(self.encoder_layers, self.layer_types):
            hidden_states = layer(
                hidden_states, rotary[layer_type], attention_mask, training=training
            )
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
        hidden_states = self.final_norm(hidden_states)
        if output_hidden_states:  # transformers 5 gives the final norm's output last
            all_hidden_states = all_hidden_states[:-1] + (hidden_states,)
        if not return_dict:
            return tuple(t for t in (hidden_states, all_hidden_states) if t is not None)
        return TFBaseModelOutput(last_hidden_state=hidden_states, hidden_states=all_hidden_states)


class TFModernBertPredictionHead(tf_keras.layers.Layer):
    """dense (bias if classifier_bias), classifier_activation, norm: before the decoder or the
    classifier."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.dense = dense(config, config.hidden_size, config.classifier_bias, "out", "dense")
        self.activation = activation(config.classifier_activation)
        self.norm = layer_norm(config, "norm")

    def build(self, input_shape=None):
        """`input_shape`: [None, None, hidden] (the default) for the masked LM's states, [None,
        hidden] for the classifier's pooled one (Keras' LayerNorm keeps the rank it was built
        for)."""
        if self.built:
            return
        self.built = True
        for layer in (self.dense, self.norm):
            with tf.name_scope(layer.name):
                layer.build(input_shape or [None, None, self.config.hidden_size])

    def call(self, hidden_states):
        return self.norm(self.activation(self.dense(hidden_states)))


class TFModernBertDecoder(tf_keras.layers.Layer):
    """Hidden states to logits: the word embeddings when tie_word_embeddings (then only the bias
    is its own, `decoder.bias`, as PyTorch's save_pretrained writes a tied model), else its own
    `decoder.weight` [vocabulary, hidden], PyTorch's layout."""

    def __init__(self, config, input_embeddings, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.input_embeddings = input_embeddings if config.tie_word_embeddings else None

    def build(self, input_shape=None):
        if self.built:
            return
        self.built = True
        if self.input_embeddings is None:
            self.weight = self.add_weight(
                name="weight",
                shape=[self.config.vocab_size, self.config.hidden_size],
                initializer=initializer(self.config, "out"),
            )
        self.bias = None
        if self.config.decoder_bias:
            self.bias = self.add_weight(
                name="bias", shape=[self.config.vocab_size], initializer="zeros"
            )

    def call(self, hidden_states):
        weight = self.weight if self.input_embeddings is None else self.input_embeddings.weight
        # a 2-D matmul: einsum's "...h,vh->...v" computes the same, but its gradient ran ~10x
        # slower on the CPU (a whole training step 7x slower than RoBERTa's at the same size)
        flat = tf.reshape(hidden_states, [-1, self.config.hidden_size])
        logits = tf.matmul(flat, tf.cast(weight, flat.dtype), transpose_b=True)
        logits = tf.reshape(logits, shape_list(hidden_states)[:-1] + [self.config.vocab_size])
        if self.bias is not None:
            logits = logits + tf.cast(self.bias, logits.dtype)
        return logits


class TFModernBertLMHead(tf_keras.layers.Layer):
    """The masked LM's head and decoder as one layer, what `get_lm_head()` returns: hidden states
    [batch, n, hidden] to logits [batch, n, vocabulary]. PyTorch has no module around them (its
    names are head.* and decoder.*), so the masked LM builds this layer without a name scope of
    its own."""

    def __init__(self, config, input_embeddings, **kwargs):
        super().__init__(**kwargs)
        self.head = TFModernBertPredictionHead(config, name="head")
        self.decoder = TFModernBertDecoder(config, input_embeddings, name="decoder")

    def build(self, input_shape=None):
        if self.built:
            return
        self.built = True
        for layer in (self.head, self.decoder):
            with tf.name_scope(layer.name):
                layer.build(None)

    def get_output_embeddings(self):
        decoder = self.decoder
        return decoder if decoder.input_embeddings is None else decoder.input_embeddings

    def get_bias(self):
        return {} if self.decoder.bias is None else {"bias": self.decoder.bias}

    def call(self, hidden_states):
        return self.decoder(self.head(hidden_states))


# The models.


class TFModernBertPreTrainedModel(TFPreTrainedModel):
    """What the models share: their config, a copy in both spellings (modernbert_config.py), so that
    save_pretrained() writes what transformers 4.57 and 5 read alike; the encoder's output."""

    config_class = ModernBertConfig
    base_model_prefix = "model"

    def __init__(self, config, *inputs, **kwargs):
        super().__init__(normalize_config(copy.deepcopy(config)), *inputs, **kwargs)

    def encode(self, input_ids, attention_mask, inputs_embeds, output_hidden_states, training):
        """The encoder's output as a ModelOutput, for the heads above it."""
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            training=training,
        )

    @staticmethod
    def output(output_class, loss, logits, outputs, return_dict):
        """A head's output as transformers' TF models give it: a ModelOutput, or a tuple of
        (loss,) logits (, hidden states) when return_dict is off."""
        if return_dict:
            return output_class(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
        output = (logits,) + (() if outputs.hidden_states is None else (outputs.hidden_states,))
        return output if loss is None else (loss,) + output


class TFModernBertModel(TFModernBertPreTrainedModel):
    """The bare encoder; [0] of its output is the last hidden state. Its weights are named
    `model.*`, as in the masked LM's and the classifier's checkpoints."""

    def __init__(self, config, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        self.model = TFModernBertMainLayer(config, name="model")

    @unpack_inputs
    def call(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        output_hidden_states=None,
        return_dict=None,
        training=False,
    ):
        outputs = self.encode(
            input_ids, attention_mask, inputs_embeds, output_hidden_states, training
        )
        return outputs if return_dict else outputs.to_tuple()

    def build(self, input_shape=None):
        if self.built:
            return
        self.built = True
        with tf.name_scope(self.model.name):
            self.model.build(None)


class TFModernBertForMaskedLM(TFModernBertPreTrainedModel, TFMaskedLanguageModelingLoss):
    """ModernBertForMaskedLM: logits over the vocabulary at every position."""

    def __init__(self, config, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        self.model = TFModernBertMainLayer(config, name="model")
        self.lm_head = TFModernBertLMHead(config, self.model.embeddings, name="lm_head")

    def get_lm_head(self):
        """The head and decoder, built with their PyTorch names (a first call through Keras would
        build it under a name scope "lm_head" of its own)."""
        if not self.built:
            self.build_in_name_scope()
        return self.lm_head

    @unpack_inputs
    def call(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        labels=None,
        output_hidden_states=None,
        return_dict=None,
        training=False,
    ):
        outputs = self.encode(
            input_ids, attention_mask, inputs_embeds, output_hidden_states, training
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None if labels is None else self.hf_compute_loss(labels, logits)
        return self.output(TFMaskedLMOutput, loss, logits, outputs, return_dict)

    def build(self, input_shape=None):
        if self.built:
            return
        self.built = True
        with tf.name_scope(self.model.name):
            self.model.build(None)
        self.lm_head.build(None)  # no scope: its sublayers are top-level names in PyTorch


class TFModernBertForSequenceClassification(
    TFModernBertPreTrainedModel, TFSequenceClassificationLoss
):
    """ModernBertForSequenceClassification: the first token's state ("cls") or the mean over the
    unpadded tokens ("mean"), the prediction head, dropout, and a classifier that always has a
    bias (classifier_bias is the head's dense's, as in transformers 5)."""

    def __init__(self, config, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        if config.classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling {config.classifier_pooling!r}: cls or mean")
        self.num_labels = config.num_labels
        self.model = TFModernBertMainLayer(config, name="model")
        self.head = TFModernBertPredictionHead(config, name="head")
        self.dropout = tf_keras.layers.Dropout(config.classifier_dropout)
        self.classifier = dense(config, config.num_labels, True, "final_out", "classifier")

    @unpack_inputs
    def call(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        labels=None,
        output_hidden_states=None,
        return_dict=None,
        training=False,
    ):
        outputs = self.encode(
            input_ids, attention_mask, inputs_embeds, output_hidden_states, training
        )
        hidden_states = outputs.last_hidden_state
        if self.config.classifier_pooling == "cls":
            pooled = hidden_states[:, 0]
        else:
            if attention_mask is None:
                attention_mask = tf.ones(shape_list(hidden_states)[:2], tf.int32)
            # float32: a sum over the sequence in bfloat16 would lose the small states' share
            weights = tf.cast(attention_mask, tf.float32)[:, :, None]
            summed = tf.reduce_sum(tf.cast(hidden_states, tf.float32) * weights, axis=1)
            pooled = tf.cast(summed / tf.reduce_sum(weights, axis=1), hidden_states.dtype)
        pooled = self.dropout(self.head(pooled), training=training)
        logits = self.classifier(pooled)
        loss = None if labels is None else self.hf_compute_loss(labels, logits)
        return self.output(TFSequenceClassifierOutput, loss, logits, outputs, return_dict)

    def build(self, input_shape=None):
        if self.built:
            return
        self.built = True
        with tf.name_scope(self.model.name):
            self.model.build(None)
        with tf.name_scope(self.head.name):
            self.head.build([None, self.config.hidden_size])
        with tf.name_scope(self.classifier.name):
            self.classifier.build([None, self.config.hidden_size])


def register():
    """Make transformers 4.57's TF auto classes build these for a ModernBertConfig
    (TFAutoModelForMaskedLM.from_config, from_pretrained); safe to call again."""
    TFAutoModel.register(ModernBertConfig, TFModernBertModel, exist_ok=True)
    TFAutoModelForMaskedLM.register(ModernBertConfig, TFModernBertForMaskedLM, exist_ok=True)
    TFAutoModelForSequenceClassification.register(
        ModernBertConfig, TFModernBertForSequenceClassification, exist_ok=True
    )


register()
