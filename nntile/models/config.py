"""GPT-2 configuration (the fields of transformers' GPT2Config that matter)."""
import dataclasses
import json
import math


TILING_KEYS = ("batch", "seq", "embd", "head", "inner", "vocab")
# the default width of the vocabulary's tiles, where it is larger (GPT2Config.sizes)
DEFAULT_VOCAB_TILE = 8192
# the largest size of a dimension: tile shapes and indices are C ints in the layers
INT_MAX = 2**31 - 1


@dataclasses.dataclass
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int = None
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    tie_word_embeddings: bool = True

    def __post_init__(self):
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT_MAX:
                raise ValueError(f"GPT2Config.{name}={value!r} must be a positive integer "
                                 f"(at most {INT_MAX})")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPT2Config: n_embd={self.n_embd} is not divisible by "
                             f"n_head={self.n_head}")
        if self.n_inner is not None and (isinstance(self.n_inner, bool) or
                                         not isinstance(self.n_inner, int)
                                         or not 1 <= self.n_inner <= INT_MAX):
            raise ValueError(f"GPT2Config.n_inner={self.n_inner!r} must be a positive integer")
        eps = self.layer_norm_epsilon
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (
                math.isfinite(eps) and eps > 0):
            raise ValueError(f"GPT2Config.layer_norm_epsilon={eps!r} must be a positive number")
        if not isinstance(self.tie_word_embeddings, bool):
            raise ValueError(f"GPT2Config.tie_word_embeddings={self.tie_word_embeddings!r} "
                             "must be true or false")
        if self.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"GPT2Config.activation_function={self.activation_function!r}: "
                             "only the tanh approximation of GELU (gelu_new) is implemented")

    @property
    def inner(self):
        return self.n_inner or 4 * self.n_embd

    def sizes(self):
        """{tiling key: (the dimension's size, its default tile)}; the batch has neither.
        One tile per dimension by default, but a large vocabulary is cut into 8192-wide
        tiles: a GEMM whose rows are not a multiple of 8 elements long (GPT-2's 50257) falls
        off cuBLAS's tensor-core kernels, and the head's three GEMMs ran 5x slower (GPT-2
        124M bf16-mixed on an H100: 63 -> 51 ms of kernels per step)."""
        return {"batch": (None, None), "seq": (self.n_positions, self.n_positions),
                "embd": (self.n_embd, self.n_embd), "head": (self.n_head, self.n_head),
                "inner": (self.inner, self.inner),
                "vocab": (self.vocab_size, min(self.vocab_size, DEFAULT_VOCAB_TILE))}

    @classmethod
    def from_dict(cls, data):
        if not isinstance(data, dict):  # a config.json holding a list, a string, ...
            raise ValueError(f"a model config is a JSON object, not {type(data).__name__} "
                             f"{repr(data)[:40]}")
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    @classmethod
    def from_json(cls, path):
        """Reads our own config or a transformers GPT-2 ``config.json``."""
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, dict) and data.get("model_type", "gpt2") != "gpt2":
            raise ValueError(f"{path}: model_type {data['model_type']!r} is not gpt2")
        return cls.from_dict(data)

    @classmethod
    def from_transformers(cls, hf_config):
        return cls.from_dict(hf_config.to_dict())

    def to_dict(self):
        return dataclasses.asdict(self)

    def num_parameters(self):
        E, V, P, L, I = self.n_embd, self.vocab_size, self.n_positions, self.n_layer, self.inner
        per_layer = 4 * E + (3 * E * E + 3 * E) + (E * E + E) + (E * I + I) + (I * E + E)
        head = 0 if self.tie_word_embeddings else V * E
        return V * E + P * E + L * per_layer + 2 * E + head
