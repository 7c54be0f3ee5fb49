"""Mistral's configuration: Llama's (llama_config.py) with sliding-window attention, the fields
of transformers' MistralConfig (its model: models/mistral.pyx).

``sliding_window``: a query sees the last ``sliding_window`` positions up to its own (keys j
with i - sliding_window < j <= i, transformers' convention); None (config.json's null) for every
earlier position. Mistral has no biases.
"""
import dataclasses

from nntile._core.core import AttentionMask
from nntile.models.llama_config import LlamaConfig


@dataclasses.dataclass
class MistralConfig(LlamaConfig):
    model_type = "mistral"
    architecture = "MistralForCausalLM"
    name = "Mistral"

    sliding_window: int = None

    def __post_init__(self):
        super().__post_init__()
        window = self.sliding_window
        if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                                   or window < 1):
            raise ValueError(f"MistralConfig.sliding_window={window!r} must be a positive int "
                             "or null (no window)")
        if self.attention_bias or self.mlp_bias:
            raise ValueError("MistralConfig: Mistral has no biases (attention_bias and mlp_bias "
                             "must be false)")

    def attention_mask(self):
        return AttentionMask(window=self.sliding_window or 0)

    def describe(self):
        window = f", window {self.sliding_window}" if self.sliding_window else ""
        return super().describe() + window

    def to_transformers_dict(self, torch_dtype="float32"):
        fields = super().to_transformers_dict(torch_dtype)
        for key in ("attention_bias", "mlp_bias"):  # not fields of transformers' Mistral
            del fields[key]
        return fields
