"""What the configs of every model family share: the tiling keys, the vocabulary's default
tile, and ``CausalLMConfig``, the base of each family's config dataclass.

A family's config (``GPT2Config``, ``LlamaConfig``) holds the fields of its transformers
config that matter, checked, and says everything the shared skeleton (models/causal_lm.pyx)
and the programs need to know about the family: its sizes for tiling, its parameter count and
FLOPs, its initialisation, and its name map to transformers' state dict (nntile.models.name_map).
Code shared by every family reads a config through transformers' canonical names
(``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
``head_dim``, ``intermediate_size``, ``max_position_embeddings``, ``vocab_size``,
``tie_word_embeddings``) and ``norm_eps``; a family whose fields are named otherwise maps them
in ``ATTRIBUTE_MAP``, as transformers' own ``attribute_map`` does.
"""
import dataclasses
import json
import math
import numbers

TILING_KEYS = ("batch", "seq", "embd", "head", "inner", "vocab")
# the default width of the vocabulary's tiles, where it is larger (CausalLMConfig.sizes)
DEFAULT_VOCAB_TILE = 8192
# how attention may be computed (a family config's ``attention`` field)
ATTENTION = ("fused", "unfused")
# the largest size of a dimension: tile shapes and indices are C ints in the layers
INT_MAX = 2**31 - 1


class CausalLMConfig:
    """The base of the families' config dataclasses (not a dataclass itself).

    A family sets ``model_type`` (transformers' name, the key of nntile.models.FAMILIES),
    ``architecture`` (transformers' model class, which config.json names), ``name`` (what
    the programs print), ``ATTRIBUTE_MAP`` (canonical name -> its field or
    property) and ``DROPOUT_FIELDS`` (read and ignored: nntile trains without dropout), and
    writes ``flops_per_token``, ``name_map``, ``initial``, ``describe``,
    ``to_transformers_dict`` and ``small``.
    """
    model_type = None
    architecture = None
    name = None
    ATTRIBUTE_MAP = {}
    DROPOUT_FIELDS = ()
    OTHER_KEYS = ()  # other keys from_dict reads

    def __getattr__(self, name):  # only called for names that are not attributes
        field = type(self).ATTRIBUTE_MAP.get(name)
        if field is None:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return getattr(self, field)

    @classmethod
    def field_name(cls, name):
        """The family's name of a canonical attribute (GPT-2: hidden_size -> n_embd), for
        messages that name what the user gave."""
        return cls.ATTRIBUTE_MAP.get(name, name)

    def replace(self, **changes):
        """A copy with some fields changed, given by canonical or own names."""
        return dataclasses.replace(self, **{self.field_name(k): v for k, v in changes.items()})

    def _check_positive(self, *names):
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT_MAX:
                raise ValueError(f"{type(self).__name__}.{name}={value!r} must be a positive "
                                 f"integer (at most {INT_MAX})")

    def _check_eps(self, name):
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value > 0):
            raise ValueError(f"{type(self).__name__}.{name}={value!r} must be a positive number")

    def _check_bool(self, *names):
        for name in names:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{type(self).__name__}.{name}={getattr(self, name)!r} must "
                                 "be true or false")

    def _check_attention(self):
        """``attention`` says how attention is computed, not what: "fused" (flash attention:
        no [seq, seq] tensor is kept) or "unfused" (the scores are tensors; the reference).
        Like transformers' attn_implementation it is not part of the model, but checkpoints
        keep it, so that a resumed run computes as before."""
        if self.attention not in ATTENTION:
            raise ValueError(f"{type(self).__name__}.attention={self.attention!r}: use "
                             f"{' or '.join(ATTENTION)}")

    def same_model(self, other):
        """Whether two configs describe the same model (how attention is computed aside)."""
        return dict(self.to_dict(), attention=None) == dict(other.to_dict(), attention=None)

    # ---- reading and writing ------------------------------------------------------------

    @classmethod
    def from_dict(cls, data):
        """From our own config dict (a checkpoint's, config.json of nntile-train --config) or a
        transformers ``config.json``: the fields we know are taken, the rest ignored."""
        if not isinstance(data, dict):  # a config.json holding a list, a string, ...
            raise ValueError(f"a model config is a JSON object, not {type(data).__name__} "
                             f"{repr(data)[:40]}")
        model_type = data.get("model_type") or "gpt2"  # checkpoints before families: gpt2
        if model_type != cls.model_type:
            raise ValueError(f"model_type {model_type!r} is not {cls.model_type}")
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    @classmethod
    def unknown_keys(cls, data):
        """The keys of our own config dict that ``from_dict`` does not read, sorted (a
        transformers config.json, which names transformers_version or architectures, holds
        many keys of transformers' own: none are unknown there)."""
        if "transformers_version" in data or "architectures" in data:
            return []
        known = {"model_type", *cls.DROPOUT_FIELDS, *cls.OTHER_KEYS,
                 *(f.name for f in dataclasses.fields(cls))}
        return sorted(set(data) - known)

    @classmethod
    def from_json(cls, path):
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError(f"{path} does not hold a JSON object")
        return cls.from_dict(data)

    @classmethod
    def from_transformers(cls, hf_config):
        return cls.from_dict(hf_config.to_dict())

    @classmethod
    def ignored(cls, data):
        """What a transformers config asks for that nntile leaves out, as notes for the
        programs to print: dropout (nntile trains without it; at inference it does nothing)."""
        return [f"{key}={data[key]} ignored (nntile trains without dropout)"
                for key in cls.DROPOUT_FIELDS
                if isinstance(data.get(key), (int, float)) and data[key] > 0]

    def to_dict(self):
        """Our config as a JSON-able dict, ``model_type`` first (checkpoints record it)."""
        return {"model_type": self.model_type, **dataclasses.asdict(self)}

    def to_transformers(self):
        """transformers' config object of this model (for tests and ``to_transformers``)."""
        import transformers
        data = self.to_transformers_dict("float32")
        return transformers.AutoConfig.for_model(
            data.pop("model_type"), **{k: v for k, v in data.items()
                                       if k not in ("architectures", "torch_dtype", "dtype")})

    # ---- tiles ----------------------------------------------------------------------------

    def sizes(self):
        """{tiling key: (the dimension's size, its default tile)}; the batch has neither.
        One tile per dimension by default, but a large vocabulary is cut into 8192-wide
        tiles: a GEMM whose rows are not a multiple of 8 elements long (GPT-2's 50257) falls
        off cuBLAS's tensor-core kernels, and the head's three GEMMs ran 5x slower (GPT-2
        124M bf16-mixed on an H100: 63 -> 51 ms of kernels per step)."""
        P, E, H, I, V = (self.max_position_embeddings, self.hidden_size,
                         self.num_attention_heads, self.intermediate_size, self.vocab_size)
        return {"batch": (None, None), "seq": (P, P), "embd": (E, E), "head": (H, H),
                "inner": (I, I), "vocab": (V, min(V, DEFAULT_VOCAB_TILE))}

    def dimension_names(self):
        """What each tiling key's size is called in messages."""
        return {"batch": "the batch size", "seq": "the sequence length",
                "embd": self.field_name("hidden_size"),
                "head": self.field_name("num_attention_heads"), "inner": "the MLP width",
                "vocab": "the vocabulary size"}

    def check_tiles(self, tiles):
        """Raise ValueError for tiles (each already within its dimension) that the family
        cannot run; grouped-query attention's head tiles, for one."""
        group = self.num_attention_heads // self.num_key_value_heads
        if tiles.get("head") is not None and tiles["head"] % group:
            raise ValueError(
                f"a tile of {tiles['head']} query heads splits a group of {group} heads "
                f"sharing one key/value head ({self.field_name('num_attention_heads')} "
                f"{self.num_attention_heads} / {self.field_name('num_key_value_heads')} "
                f"{self.num_key_value_heads}): give a multiple of {group} (the key/value "
                f"tile is then that divided by {group})")

    def recomputed_blocks(self, recompute):
        """How many blocks, the first ones, recompute their activations in backward
        (CausalLM's ``recompute``): True every block, False (or None) none, or a number of
        them from 0 to num_hidden_layers."""
        layers = self.num_hidden_layers
        if recompute is None or recompute is False:
            return 0
        if recompute is True:
            return layers
        if isinstance(recompute, numbers.Integral) and 0 <= recompute <= layers:
            return int(recompute)
        raise ValueError(f"recompute={recompute!r}: use True, False or a number of blocks "
                         f"from 0 to {layers} ({self.field_name('num_hidden_layers')})")

    # ---- what the family computes ---------------------------------------------------------

    def attention_flops_per_token(self, seq):
        """Attention's score and value GEMMs, forward and backward: 12 x layers x the width of
        the heads x the sequence (no causal discount, as is usual)."""
        return 12 * self.num_hidden_layers * self.num_attention_heads * self.head_dim * seq

    def init_weights(self, parameters, seed):
        """Initial values of ``parameters`` ((name, shape) pairs, in order), from a seeded
        numpy Generator (same seed, same weights); ``initial(name)`` gives each one's
        (mean, standard deviation), and a deviation of 0 draws nothing."""
        import numpy as np
        rng = np.random.Generator(np.random.PCG64(seed))
        for name, shape in parameters:
            mean, std = self.initial(name)
            yield name, (rng.normal(mean, std, shape) if std else np.full(shape, float(mean)))

    def num_parameters(self):
        """The parameter count: what the name map gives our parameters (a tied head counts
        once, as in transformers' ``num_parameters``)."""
        def count(config):
            return sum(math.prod(shape) for shape in config.name_map().params().values())
        layers = self.num_hidden_layers
        if layers <= 2:
            return count(self)
        # every block has the same parameters: two models' counts give any depth's, without
        # listing the names of an absurd depth (the memory pre-check refuses n_layer 10**9)
        one, two = (count(self.replace(num_hidden_layers=n)) for n in (1, 2))
        return one + (layers - 1) * (two - one)
