"""The inverse frequencies of rotary position embeddings (RoPE), from a Llama config's
``rope_theta`` and ``rope_scaling``: what transformers' ROPE_INIT_FUNCTIONS compute, in
float64 with numpy. A model computes them once, stores them in its master dtype as the
[head_dim/2] ``inv_freq`` tensor of ``ops.rope_forward`` and passes the attention scaling as
its ``scale``."""
import math

import numpy as np

ROPE_TYPES = ("default", "linear", "llama3")


def rope_inv_freq(head_dim, rope_theta, rope_scaling=None):
    """(inv_freq, attention_scaling): inv_freq[j] = 1 / rope_theta**(2j / head_dim) for j <
    head_dim/2 (float64), rescaled as ``rope_scaling`` says:

    - None or rope_type "default": unchanged;
    - "linear" (factor): every frequency divided by factor;
    - "llama3" (factor, low_freq_factor, high_freq_factor,
      original_max_position_embeddings): with wavelength w = 2 pi / f and L the original
      context length, f / factor where w > L / low_freq_factor, f where w < L /
      high_freq_factor, and in between the blend (1 - s) f / factor + s f with s = (L / w -
      low_freq_factor) / (high_freq_factor - low_freq_factor).

    The attention scaling is 1.0 for all three. The rope type is read from "rope_type" (or
    the older "type"). Any other type, or a missing parameter, is a ValueError.
    """
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 \
            or head_dim % 2:
        raise ValueError(f"rope: head_dim={head_dim!r} must be an even integer >= 2")
    if not (isinstance(rope_theta, (int, float)) and rope_theta > 0
            and math.isfinite(rope_theta)):
        raise ValueError(f"rope: rope_theta={rope_theta!r} must be a positive number")
    inv_freq = 1.0 / float(rope_theta) ** (np.arange(0, head_dim, 2, dtype=np.float64)
                                           / head_dim)
    scaling = dict(rope_scaling or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope: rope_type {rope_type!r} is not supported; use one of "
                         f"{', '.join(ROPE_TYPES)}")
    if rope_type == "default":
        return inv_freq, 1.0
    factor = _positive(scaling, "factor")
    if rope_type == "linear":
        return inv_freq / factor, 1.0
    low, high = _positive(scaling, "low_freq_factor"), _positive(scaling, "high_freq_factor")
    context = _positive(scaling, "original_max_position_embeddings")
    if not high > low:
        raise ValueError(f"rope: llama3 needs high_freq_factor ({high}) > low_freq_factor "
                         f"({low})")
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    blend = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < context / high) & ~(wavelen > context / low)
    return np.where(medium, blend, scaled), 1.0


def _positive(scaling, key):
    value = scaling.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not math.isfinite(value):
        raise ValueError(f"rope: rope_scaling needs {key} > 0, got {value!r}")
    return float(value)
