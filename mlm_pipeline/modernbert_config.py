"""ModernBERT's config as transformers 5 reads it, for the TF model in modernbert.py.

transformers 4.57, the last line with TF models, has `ModernBertConfig` but not the model; its
config drives modernbert.py's classes, so a published config.json means here what it means there.
transformers 5 stores the attention pattern and the RoPE bases as `layer_types` and
`rope_parameters`, where transformers 4.57 has `global_attn_every_n_layers`, `global_rope_theta`
and `local_rope_theta`; 4.57 reads a transformers 5 config.json with its own defaults for the
thetas. `attention_layout()` reads a config as transformers 5 would, and `normalize_config()` puts
both spellings in agreement, as the models do when they are built. transformers keeps this apart
from the model as well (configuration_modernbert.py).
"""

from .errors import UsageError

FULL_ATTENTION = "full_attention"  # transformers 5's name for a global layer
SLIDING_ATTENTION = "sliding_attention"  # and for a local one
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)


def attention_layout(config):
    """(layer types, {layer type: RoPE theta}) as transformers 5 reads the same fields.

    transformers 5 takes `layer_types` when present, else a global layer every
    `global_attn_every_n_layers` layers from layer 0; a theta from `rope_parameters[type]` when
    present, else from `global_rope_theta` (global layers) and `local_rope_theta` (local ones)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        every = config.global_attn_every_n_layers
        layer_types = [
            SLIDING_ATTENTION if index % every else FULL_ATTENTION
            for index in range(config.num_hidden_layers)
        ]
    layer_types = list(layer_types)
    if len(layer_types) != config.num_hidden_layers:
        raise ValueError(
            f"the ModernBERT config has {len(layer_types)} layer_types for "
            f"{config.num_hidden_layers} layers"
        )
    unknown = sorted(set(layer_types) - set(LAYER_TYPES))
    if unknown:
        raise ValueError(f"the ModernBERT config has unknown layer_types {unknown}")
    if getattr(config, "rope_scaling", None):
        raise NotImplementedError("ModernBERT in TF has plain RoPE only, not rope_scaling")
    legacy = {FULL_ATTENTION: config.global_rope_theta, SLIDING_ATTENTION: config.local_rope_theta}
    rope_parameters = getattr(config, "rope_parameters", None) or {}
    thetas = {}
    for layer_type in LAYER_TYPES:
        parameters = rope_parameters.get(layer_type) or {}
        rope_type = parameters.get("rope_type", parameters.get("type", "default"))
        if rope_type != "default":
            # scaled variants change the frequencies; a model that differs silently is worse
            raise NotImplementedError(
                f"ModernBERT in TF has plain RoPE only, not rope_type {rope_type!r}"
            )
        thetas[layer_type] = float(parameters.get("rope_theta", legacy[layer_type]))
    return layer_types, thetas


def sliding_window(config):
    """The tokens a local layer attends each side of a query: `local_attention // 2`, as
    transformers 5's `ModernBertConfig.sliding_window` (|i - j| <= it, and-ed with the padding)."""
    return config.local_attention // 2


def check_local_attention(config, where, remedy):
    """An odd window would silently be the even one below it (sliding_window() halves it), so it is
    refused in one line. `where` names the config; `remedy` says what to do, {even} and {larger} in
    it the even windows below and above."""
    window = getattr(config, "local_attention", None)
    if config.model_type != "modernbert" or window is None or window % 2 == 0:
        return
    for name, value in (("{even}", window - 1), ("{larger}", window + 1)):
        remedy = remedy.replace(name, str(value))
    raise UsageError(
        f"{where} has an odd ModernBERT local_attention {window}: its local layers attend "
        f"local_attention // 2 = {window // 2} tokens each side (as in transformers), just as with "
        f"local_attention {window - 1}; {remedy}."
    )


def global_layer_period(layer_types, preferred=None):
    """The n for which layer i is global exactly when i % n == 0 (`preferred` if it fits, else
    the smallest), or None when the pattern is no such period."""
    candidates = range(1, len(layer_types) + 1)
    if preferred:
        candidates = [preferred, *candidates]
    for period in candidates:
        pattern = [
            SLIDING_ATTENTION if i % period else FULL_ATTENTION for i in range(len(layer_types))
        ]
        if pattern == list(layer_types):
            return period
    return None


def normalize_config(config):
    """Make both spellings of `config` (in place; returned) say what transformers 5 reads.

    transformers 4.57 reads a config.json saved by transformers 5 with its own default thetas
    (160,000 and 10,000) and keeps `layer_types` and `rope_parameters` as plain attributes; it
    also saves them back. transformers 5 reads those first. So the 5 spelling decides, and the
    4.57 fields (`global_rope_theta`, `local_rope_theta`, `global_attn_every_n_layers`) are set
    from it; both are written by `config.save_pretrained()` and mean the same to either version.
    A pattern no period describes is left to `layer_types` alone."""
    layer_types, thetas = attention_layout(config)
    config.global_rope_theta = thetas[FULL_ATTENTION]
    config.local_rope_theta = thetas[SLIDING_ATTENTION]
    period = global_layer_period(layer_types, config.global_attn_every_n_layers)
    if period is not None:
        config.global_attn_every_n_layers = period
    config.layer_types = layer_types
    config.rope_parameters = {
        layer_type: {"rope_type": "default", "rope_theta": thetas[layer_type]}
        for layer_type in LAYER_TYPES
    }
    return config


def use_legacy_layout(config):
    """Drop `layer_types` and `rope_parameters` from `config` (in place; returned), so that
    `global_attn_every_n_layers`, `global_rope_theta` and `local_rope_theta` decide again.

    For a change to one of those (run_mlm.py's --config_overrides) on a config that holds the
    transformers 5 spelling, which both transformers 5 and these models would otherwise read
    first, ignoring the change; `num_hidden_layers` needs it too, or `layer_types` no longer
    fits."""
    for name in ("layer_types", "rope_parameters"):
        if hasattr(config, name):
            delattr(config, name)
    return config
