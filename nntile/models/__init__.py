"""Model families on tiled tensors. Each is a config (the fields of its transformers config,
with its name map to transformers' state dict) and a model class: the causal-LM skeleton
(``CausalLM``) with the family's embeddings, block and final norm. ``FAMILIES`` finds them by
``model_type``."""
from nntile.models.causal_lm import CausalLM
from nntile.models.config import CausalLMConfig
from nntile.models.families import (FAMILIES, config_class, config_from_dict, model_class,
                                    trainable)
from nntile.models.gpt2 import GPT2LMHead
from nntile.models.gpt2_config import GPT2Config
from nntile.models.llama import LlamaLM
from nntile.models.llama_config import LlamaConfig

__all__ = ["CausalLM", "CausalLMConfig", "FAMILIES", "GPT2Config", "GPT2LMHead", "LlamaConfig",
           "LlamaLM", "config_class", "config_from_dict", "model_class", "trainable"]
