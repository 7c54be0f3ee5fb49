"""GPT-2's configuration (the fields of transformers' GPT2Config that matter) and its name map
to transformers' GPT2LMHeadModel state dict."""
import dataclasses
import math

from nntile.models.config import CausalLMConfig
from nntile.models.name_map import NameMap, fused, reshaped, same

# transformers' GPT-2 options that change the model; nntile computes the usual value only
UNSUPPORTED = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
               "reorder_and_upcast_attn": False, "add_cross_attention": False}


@dataclasses.dataclass
class GPT2Config(CausalLMConfig):
    model_type = "gpt2"
    architecture = "GPT2LMHeadModel"
    name = "GPT-2"
    ATTRIBUTE_MAP = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
                     "num_attention_heads": "n_head", "num_key_value_heads": "n_head",
                     "max_position_embeddings": "n_positions", "intermediate_size": "inner",
                     "norm_eps": "layer_norm_epsilon"}
    DROPOUT_FIELDS = ("resid_pdrop", "embd_pdrop", "attn_pdrop")
    OTHER_KEYS = tuple(UNSUPPORTED)

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int = None
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    tie_word_embeddings: bool = True
    attention: str = "fused"  # CausalLMConfig._check_attention

    def __post_init__(self):
        self._check_positive("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
        self._check_attention()
        if self.n_embd % self.n_head:
            raise ValueError(f"GPT2Config: n_embd={self.n_embd} is not divisible by "
                             f"n_head={self.n_head}")
        if self.n_inner is not None:
            self._check_positive("n_inner")
        self._check_eps("layer_norm_epsilon")
        self._check_bool("tie_word_embeddings")
        if self.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"GPT2Config.activation_function={self.activation_function!r}: "
                             "only the tanh approximation of GELU (gelu_new) is implemented")

    @classmethod
    def from_dict(cls, data):
        config = super().from_dict(data)  # checks that data is a dict
        for key, usual in UNSUPPORTED.items():
            if data.get(key, usual) != usual:
                raise ValueError(f"{key}={data[key]!r} is not supported (only {usual!r})")
        return config

    @classmethod
    def small(cls, vocab_size, seq_len, n_layer=None, n_head=None, n_embd=None):
        """nntile-train's default model: 4 layers, 4 heads, n_embd 128 (0.84M parameters on
        the byte-level corpus)."""
        return cls(vocab_size=vocab_size, n_positions=seq_len, n_embd=n_embd or 128,
                   n_layer=n_layer or 4, n_head=n_head or 4)

    @property
    def inner(self):
        return self.n_inner or 4 * self.n_embd

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    def describe(self):
        return (f"{self.n_layer} layers, {self.n_head} heads, n_embd {self.n_embd}, "
                f"vocabulary {self.vocab_size}")

    def flops_per_token(self, seq):
        """Model FLOPs per trained token: 6 x the parameters that multiply (all but the
        position embeddings) plus attention's."""
        params = self.num_parameters() - self.n_positions * self.n_embd
        return 6 * params + self.attention_flops_per_token(seq)

    def initial(self, name):
        """(mean, std) of a parameter's initial values: GPT-2's, with the residual
        projections scaled by 1/sqrt(2 x layers)."""
        if name.endswith(".bias"):
            return 0.0, 0.0
        if ".ln_" in name or name.startswith("transformer.ln_f"):
            return 1.0, 0.0
        if name.endswith("c_proj.weight"):
            return 0.0, 0.02 / math.sqrt(2 * self.n_layer)
        return 0.0, 0.02

    def name_map(self):
        """transformers' GPT2LMHeadModel state dict. Its ``Conv1D`` weights are [in, out], as
        ours; the fused c_attn is our q, k and v side by side, heads kept apart."""
        V, P, E, H, D, I = (self.vocab_size, self.n_positions, self.n_embd, self.n_head,
                            self.head_dim, self.inner)
        entries = [same("transformer.wte.weight", (V, E)), same("transformer.wpe.weight", (P, E))]
        for i in range(self.n_layer):
            h = f"transformer.h.{i}."
            entries += [
                same(h + "ln_1.weight", (E,)), same(h + "ln_1.bias", (E,)),
                fused(h + "attn.c_attn.weight", (E, 3 * E),
                      [(f"{h}attn.{x}.weight", (E, H, D)) for x in "qkv"]),
                fused(h + "attn.c_attn.bias", (3 * E,),
                      [(f"{h}attn.{x}.bias", (H, D)) for x in "qkv"]),
                reshaped(h + "attn.c_proj.weight", (E, E), (H, D, E)),
                same(h + "attn.c_proj.bias", (E,)),
                same(h + "ln_2.weight", (E,)), same(h + "ln_2.bias", (E,)),
                same(h + "mlp.c_fc.weight", (E, I)), same(h + "mlp.c_fc.bias", (I,)),
                same(h + "mlp.c_proj.weight", (I, E)), same(h + "mlp.c_proj.bias", (E,))]
        entries += [same("transformer.ln_f.weight", (E,)), same("transformer.ln_f.bias", (E,))]
        if not self.tie_word_embeddings:
            entries.append(same("lm_head.weight", (V, E)))
        ignored = [r".*\.attn\.(masked_)?bias"]  # older checkpoints' causal-mask buffers
        if self.tie_word_embeddings:
            ignored.append(r"lm_head\.weight")  # the embedding, where a state dict holds it
        return NameMap(entries, "transformer.", ignored)

    def to_transformers_dict(self, torch_dtype="float32"):
        """transformers' config.json for this model, with weights of ``torch_dtype``."""
        out = {"architectures": [self.architecture], "model_type": self.model_type,
               "vocab_size": self.vocab_size, "n_positions": self.n_positions,
               "n_ctx": self.n_positions, "n_embd": self.n_embd, "n_layer": self.n_layer,
               "n_head": self.n_head, "n_inner": self.n_inner,
               "activation_function": self.activation_function,
               "layer_norm_epsilon": self.layer_norm_epsilon,
               "tie_word_embeddings": self.tie_word_embeddings,
               "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
               "torch_dtype": torch_dtype, "dtype": torch_dtype}
        eot = 50256 if self.vocab_size > 50256 else None  # GPT-2's end of text, if it has it
        out["bos_token_id"] = out["eos_token_id"] = eot
        return out
