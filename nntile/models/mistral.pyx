# cython: language_level=3
"""Mistral with a language-model head on tiled tensors: transformers' MistralForCausalLM.
Llama's model (models/llama.pyx) with Mistral's config, whose ``attention_mask`` gives the
attention its mask."""
from nntile.models.llama import LlamaLM
from nntile.models.mistral_config import MistralConfig


class MistralLM(LlamaLM):
    """Mistral language model over tiles (CausalLM says what the arguments are)."""
    config_type = MistralConfig
