"""Llama's configuration (the fields of transformers' LlamaConfig that matter) and its name map
to transformers' LlamaForCausalLM state dict.

Rotary positions: ``rope_theta`` and ``rope_scaling`` (None, ``linear`` or ``llama3``), read
from either spelling of a config.json: transformers 4's top-level ``rope_theta`` and
``rope_scaling`` (whose type may be under ``type`` or ``rope_type``), or transformers 5's
``rope_parameters``. Both are written, so that either version loads what we export.
"""
import dataclasses

from nntile._core.core import AttentionMask
from nntile.models.config import CausalLMConfig
from nntile.models.name_map import NameMap, linear, same

# the parameters of each scaling nntile implements (besides rope_type and rope_theta)
ROPE_SCALINGS = {"linear": ("factor",),
                 "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings")}


def _rope_scaling(value):
    """A config's rope scaling in our form, {"rope_type": ..., its parameters}, or None for
    plain rotary positions; ValueError for a kind nntile does not implement."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"LlamaConfig.rope_scaling={value!r} must be a dict or None")
    kind = value.get("rope_type", value.get("type", "default"))
    if kind == "default":
        return None
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"LlamaConfig: rope type {kind!r} is not implemented (nntile has "
                         f"default, {', '.join(ROPE_SCALINGS)})")
    if value.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("LlamaConfig: partial_rotary_factor "
                         f"{value['partial_rotary_factor']} is not implemented (only 1.0)")
    out = {"rope_type": kind}
    for key in ROPE_SCALINGS[kind]:
        number = value.get(key)
        if isinstance(number, bool) or not isinstance(number, (int, float)) or number <= 0:
            raise ValueError(f"LlamaConfig: {kind} rope scaling needs a positive {key}, got "
                             f"{number!r}")
        out[key] = number
    if kind == "llama3" and not out["low_freq_factor"] < out["high_freq_factor"]:
        raise ValueError("LlamaConfig: llama3 rope scaling needs low_freq_factor < "
                         f"high_freq_factor, got {out['low_freq_factor']} and "
                         f"{out['high_freq_factor']}")
    return out


@dataclasses.dataclass
class LlamaConfig(CausalLMConfig):
    model_type = "llama"
    architecture = "LlamaForCausalLM"
    name = "Llama"
    ATTRIBUTE_MAP = {"norm_eps": "rms_norm_eps"}
    DROPOUT_FIELDS = ("attention_dropout",)
    OTHER_KEYS = ("rope_parameters",)

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = None   # None: num_attention_heads (no grouping)
    head_dim: int = None              # None: hidden_size / num_attention_heads
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict = None
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    attention: str = "fused"  # CausalLMConfig._check_attention

    def __post_init__(self):
        own = type(self).__name__  # LlamaConfig, or a family's built on it
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        self._check_positive("vocab_size", "hidden_size", "intermediate_size",
                             "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                             "max_position_embeddings")
        self._check_attention()
        self._check_eps("rms_norm_eps")
        self._check_bool("tie_word_embeddings", "attention_bias", "mlp_bias")
        H, Hkv = self.num_attention_heads, self.num_key_value_heads
        if self.head_dim is None:
            if self.hidden_size % H:
                raise ValueError(f"{own}: hidden_size={self.hidden_size} is not "
                                 f"divisible by num_attention_heads={H} (or give head_dim)")
            self.head_dim = self.hidden_size // H
        self._check_positive("head_dim")
        if self.head_dim % 2:
            raise ValueError(f"{own}.head_dim={self.head_dim} must be even (rotary "
                             "positions turn pairs of its halves)")
        if H % Hkv:
            raise ValueError(f"{own}: num_attention_heads={H} is not divisible by "
                             f"num_key_value_heads={Hkv}")
        if self.hidden_act != "silu":
            raise ValueError(f"{own}.hidden_act={self.hidden_act!r}: only silu is "
                             "implemented")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{own}.{name}={value!r} must be a positive number")
        for name in ("attention_bias", "mlp_bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{own}.{name}={getattr(self, name)!r} must be true or "
                                 "false")
        self.rope_scaling = _rope_scaling(self.rope_scaling)

    @classmethod
    def from_dict(cls, data):
        """Also reads transformers 5's ``rope_parameters`` (theta, type and scaling in one)."""
        params = data.get("rope_parameters")
        if params is not None:
            if not isinstance(params, dict) or "rope_type" not in params and "type" not in params:
                raise ValueError(f"LlamaConfig: rope_parameters={params!r} is not one dict of "
                                 "rope_type, rope_theta and the scaling's parameters")
            data = dict(data, rope_scaling=params)
            if "rope_theta" in params:
                data["rope_theta"] = params["rope_theta"]
        return super().from_dict(data)

    @classmethod
    def small(cls, vocab_size, seq_len, n_layer=None, n_head=None, n_embd=None,
              n_kv_head=None):
        """nntile-train's default Llama: 4 layers, hidden 128, 4 heads sharing 2 key/value
        heads, an MLP of 3.125 x hidden = 400 and a tied head (0.84M parameters on the
        byte-level corpus, GPT-2's default size). Without ``n_kv_head``, heads share a
        key/value head in pairs where their count is even."""
        hidden, heads = n_embd or 128, n_head or 4
        return cls(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=25 * hidden // 8,
                   num_hidden_layers=n_layer or 4, num_attention_heads=heads,
                   num_key_value_heads=n_kv_head or (heads // 2 if heads % 2 == 0 else heads),
                   max_position_embeddings=seq_len, rms_norm_eps=1e-5, tie_word_embeddings=True)

    def describe(self):
        return (f"{self.num_hidden_layers} layers, {self.num_attention_heads} heads "
                f"({self.num_key_value_heads} key/value), hidden {self.hidden_size}, MLP "
                f"{self.intermediate_size}, vocabulary {self.vocab_size}")

    def flops_per_token(self, seq):
        """Model FLOPs per trained token: 6 x the parameters that multiply (all but an untied
        embedding, which is a lookup) plus attention's."""
        lookup = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return 6 * (self.num_parameters() - lookup) + self.attention_flops_per_token(seq)

    def initial(self, name):
        """(mean, std) of a parameter's initial values: transformers' Llama initialisation
        (normal 0.02, norms at one, biases at zero)."""
        if name.endswith(".bias"):
            return 0.0, 0.0
        if name.endswith("norm.weight"):
            return 1.0, 0.0
        return 0.0, 0.02

    @property
    def qkv_bias(self):
        """Whether the q, k and v projections have biases."""
        return self.attention_bias

    @property
    def o_bias(self):
        """Whether the output projection of attention has a bias."""
        return self.attention_bias

    def name_map(self):
        """transformers' LlamaForCausalLM state dict. Every name is ours too; its ``nn.Linear``
        weights are [out, in] and ours [in, out], heads kept apart: q_proj [H*D, E] is our
        [E, H, D], o_proj [E, H*D] our [H, D, E]."""
        V, E, I = self.vocab_size, self.hidden_size, self.intermediate_size
        H, Hkv, D = self.num_attention_heads, self.num_key_value_heads, self.head_dim
        entries = [same("model.embed_tokens.weight", (V, E))]
        for i in range(self.num_hidden_layers):
            attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            entries += (linear(attn + "q_proj", (E,), (H, D), self.qkv_bias)
                        + linear(attn + "k_proj", (E,), (Hkv, D), self.qkv_bias)
                        + linear(attn + "v_proj", (E,), (Hkv, D), self.qkv_bias)
                        + linear(attn + "o_proj", (H, D), (E,), self.o_bias)
                        + self.attention_extras(attn)
                        + linear(mlp + "gate_proj", (E,), (I,), self.mlp_bias)
                        + linear(mlp + "up_proj", (E,), (I,), self.mlp_bias)
                        + linear(mlp + "down_proj", (I,), (E,), self.mlp_bias)
                        + [same(f"model.layers.{i}.input_layernorm.weight", (E,)),
                           same(f"model.layers.{i}.post_attention_layernorm.weight", (E,))])
        entries.append(same("model.norm.weight", (E,)))
        if not self.tie_word_embeddings:
            entries.append(same("lm_head.weight", (V, E)))
        ignored = [r".*rotary_emb\.inv_freq"]  # a buffer that older checkpoints hold
        if self.tie_word_embeddings:
            ignored.append(r"lm_head\.weight")  # the embedding, where a state dict holds it
        return NameMap(entries, "model.", ignored)

    def attention_mask(self):
        """Which keys each query of attention sees (an AttentionMask): causal attention; a
        family whose mask differs overrides this (Mistral)."""
        return AttentionMask()

    def attention_extras(self, prefix):
        """The name map's entries of a layer's attention (under ``prefix``) besides the four
        projections: none in Llama."""
        return []

    def to_transformers_dict(self, torch_dtype="float32"):
        """transformers' config.json for this model, with weights of ``torch_dtype``; rotary
        positions both as transformers 5 writes them and as transformers 4 reads them."""
        fields = dataclasses.asdict(self)  # copies: transformers changes the dicts it reads
        del fields["attention"]  # ours: how we compute it
        rope = dict(self.rope_scaling or {"rope_type": "default"}, rope_theta=self.rope_theta)
        return {"architectures": [self.architecture], "model_type": self.model_type, **fields,
                "rope_parameters": rope,
                "attention_dropout": 0.0, "torch_dtype": torch_dtype, "dtype": torch_dtype}
