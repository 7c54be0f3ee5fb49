"""Qwen3's configuration (the fields of transformers' Qwen3Config that matter) and its name
map to transformers' Qwen3ForCausalLM state dict: Qwen2's, but with biases on q, k, v and o
only where ``attention_bias`` says, an explicit ``head_dim`` (transformers' default 128, not
hidden / heads), and an RMSNorm over each head of q and of k (``q_norm``, ``k_norm``, weights
of head_dim) before the rotation."""
import dataclasses

from nntile.models.llama_config import LlamaConfig
from nntile.models.name_map import same
from nntile.models.qwen2_config import Qwen2Config


@dataclasses.dataclass
class Qwen3Config(Qwen2Config):
    model_type = "qwen3"
    architecture = "Qwen3ForCausalLM"
    name = "Qwen3"

    head_dim: int = 128

    # biases where attention_bias says, as Llama's
    qkv_bias = LlamaConfig.qkv_bias
    o_bias = LlamaConfig.o_bias

    def attention_extras(self, prefix):
        """The per-head norms of q and k."""
        return [same(prefix + "q_norm.weight", (self.head_dim,)),
                same(prefix + "k_norm.weight", (self.head_dim,))]

    @classmethod
    def small(cls, vocab_size, seq_len, n_layer=None, n_head=None, n_embd=None,
              n_kv_head=None):
        """Llama's small model (LlamaConfig.small), heads of hidden / heads."""
        config = super().small(vocab_size, seq_len, n_layer, n_head, n_embd, n_kv_head)
        return config.replace(head_dim=config.hidden_size // config.num_attention_heads)
