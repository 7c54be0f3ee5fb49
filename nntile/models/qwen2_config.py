"""Qwen2 and Qwen2.5's configuration (the fields of transformers' Qwen2Config that matter) and
its name map to transformers' Qwen2ForCausalLM state dict: Llama's, with biases on the q, k and
v projections and none on o, whatever ``attention_bias`` says (transformers' Qwen2 does not
read it), and no MLP biases.

Released Qwen2 configs set ``use_sliding_window`` false; nntile computes full causal attention
only, so a config that turns the window on is refused.
"""
import dataclasses

from nntile.models.llama_config import LlamaConfig


@dataclasses.dataclass
class Qwen2Config(LlamaConfig):
    model_type = "qwen2"
    architecture = "Qwen2ForCausalLM"
    name = "Qwen2"
    OTHER_KEYS = LlamaConfig.OTHER_KEYS + ("sliding_window", "max_window_layers", "layer_types")

    # transformers' Qwen2Config defaults where they differ from Llama's
    vocab_size: int = 151936
    intermediate_size: int = 22016
    max_position_embeddings: int = 32768
    use_sliding_window: bool = False

    def __post_init__(self):
        super().__post_init__()
        self._check_bool("use_sliding_window")
        if self.use_sliding_window:
            raise ValueError(f"{type(self).__name__}: use_sliding_window true is not "
                             "implemented (nntile computes full causal attention)")
        if self.mlp_bias:
            raise ValueError(f"{type(self).__name__}.mlp_bias=True: the {self.name} MLP has no "
                             "biases")

    @classmethod
    def from_dict(cls, data):
        """Also refuses a config whose ``layer_types`` name a window (transformers derives
        them from use_sliding_window unless given)."""
        layers = data.get("layer_types") if isinstance(data, dict) else None
        if isinstance(layers, list) and any(kind != "full_attention" for kind in layers):
            raise ValueError(f"{cls.__name__}: layer_types other than full_attention are not "
                             "implemented (nntile computes full causal attention)")
        return super().from_dict(data)

    @property
    def qkv_bias(self):
        return True

    @property
    def o_bias(self):
        return False
