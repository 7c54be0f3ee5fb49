# cython: language_level=3
"""Qwen2 and Qwen2.5 with a language-model head on tiled tensors: transformers'
Qwen2ForCausalLM. Llama's model (models/llama.pyx) with Qwen2's config, whose ``qkv_bias`` and
``o_bias`` give the attention its biases."""
from nntile.models.llama import LlamaLM
from nntile.models.qwen2_config import Qwen2Config


class Qwen2LM(LlamaLM):
    """Qwen2 language model over tiles (CausalLM says what the arguments are)."""
    config_type = Qwen2Config
