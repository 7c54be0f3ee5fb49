"""Name maps: how a family's parameters are transformers' state-dict tensors, as data.

An entry (``HFTensor``) is one tensor of transformers' state dict: its name, its shape, and
the parameters of ours it holds (``Piece``). Its array becomes ours in three steps, each one
stated by the entry:

1. transposed, where transformers stores a matrix [out, in] (``nn.Linear``) and our ``Linear``
   [in, out] (GPT-2's ``Conv1D`` is [in, out] already);
2. cut into ranges of its last axis, where one tensor holds several of ours (GPT-2's fused
   ``c_attn`` holds q, k and v);
3. each piece reshaped to its parameter's shape (our attention keeps heads apart: [E, H, D]).

Export runs the steps backwards. A family's config builds its map (``config.name_map()``),
the model checks at construction that its parameters are the map's, names and shapes, and
loads and saves through it (models/causal_lm.pyx); the programs read and write transformers
directories with it (nntile.transformers_io). A tied model's map has no ``lm_head.weight``.
"""
import math
import re
from typing import NamedTuple

import numpy as np


class Piece(NamedTuple):
    """One parameter of ours inside a transformers tensor: its name, its shape, and the range
    [start, stop) of the (transposed) tensor's last axis that it holds (None: all of it)."""
    param: str
    shape: tuple
    cols: tuple = None


class HFTensor(NamedTuple):
    """One tensor of transformers' state dict and the parameters of ours it holds."""
    name: str
    shape: tuple
    pieces: tuple
    transpose: bool = False

    def to_ours(self, array):
        """{our parameter: its array} from transformers' array (of this entry's shape)."""
        a = array.T if self.transpose else array
        return {p.param: (a if p.cols is None else a[..., p.cols[0]:p.cols[1]]).reshape(p.shape)
                for p in self.pieces}

    def to_hf(self, arrays):
        """transformers' array from {our parameter: its array}."""
        cut = self.shape[::-1] if self.transpose else self.shape
        parts = [np.asarray(arrays[p.param]).reshape(cut[:-1] + (-1,)) for p in self.pieces]
        whole = parts[0].reshape(cut) if len(parts) == 1 else np.concatenate(parts, axis=-1)
        return np.ascontiguousarray(whole.T if self.transpose else whole)


def same(name, shape):
    """A tensor that is one parameter of ours, of the same name and shape."""
    return HFTensor(name, tuple(shape), (Piece(name, tuple(shape)),))


def reshaped(name, hf_shape, shape):
    """One parameter of ours, of the same name, in another shape (heads kept apart)."""
    return HFTensor(name, tuple(hf_shape), (Piece(name, tuple(shape)),))


def fused(name, hf_shape, params):
    """Several parameters of ours, ``params`` [(name, shape)], side by side along the last
    axis in this order."""
    pieces, start = [], 0
    for param, shape in params:
        width = math.prod(shape) // math.prod(hf_shape[:-1])
        pieces.append(Piece(param, tuple(shape), (start, start + width)))
        start += width
    if start != hf_shape[-1]:
        raise ValueError(f"{name}: pieces of {start} columns in a tensor of {hf_shape[-1]}")
    return HFTensor(name, tuple(hf_shape), tuple(pieces))


def linear(name, in_shape, out_shape, bias):
    """transformers' ``nn.Linear`` ``name`` (weight [out, in], bias [out]) as our ``Linear``
    of the same name (weight [*in_shape, *out_shape], bias [*out_shape])."""
    n_in, n_out = math.prod(in_shape), math.prod(out_shape)
    entries = [HFTensor(f"{name}.weight", (n_out, n_in),
                        (Piece(f"{name}.weight", tuple(in_shape) + tuple(out_shape)),),
                        transpose=True)]
    if bias:
        entries.append(reshaped(f"{name}.bias", (n_out,), out_shape))
    return entries


class NameMap:
    """A family's name map: the entries in transformers' state-dict order, the prefix of its
    base model's names (a checkpoint of GPT2Model or LlamaModel has no head and none of this
    prefix), and the patterns of keys a transformers state dict may hold that carry nothing
    of ours (buffers of older versions; a tied head, which is the embedding)."""

    def __init__(self, entries, base_prefix="", ignored=()):
        self.entries = list(entries)
        self.base_prefix = base_prefix
        self.ignored = re.compile("|".join(f"(?:{p})" for p in ignored)) if ignored else None

    def __iter__(self):
        return iter(self.entries)

    def __len__(self):
        return len(self.entries)

    def params(self):
        """{our parameter name: its shape}, in the map's order."""
        return {p.param: p.shape for entry in self.entries for p in entry.pieces}

    def hf_shapes(self):
        """{transformers name: its shape}: the state dict this map reads and writes."""
        return {entry.name: entry.shape for entry in self.entries}

    def _prefixed(self, state):
        """A base model's state dict (no head, no prefix) under the full model's names."""
        if self.base_prefix and state and not any(k.startswith(self.base_prefix) for k in state):
            return {k if k.startswith("lm_head.") else self.base_prefix + k: v
                    for k, v in state.items()}
        return state

    def check(self, state):
        """Raise KeyError or ValueError unless ``state`` (transformers names -> arrays) holds
        every tensor of the map in its shape, and nothing else but ignored keys."""
        state = self._prefixed(state)
        for entry in self.entries:
            if entry.name not in state:
                raise KeyError(f"state dict has no {entry.name!r}")
            shape = tuple(np.shape(state[entry.name]))
            if shape != entry.shape:
                raise ValueError(f"{entry.name}: shape {shape}, the model expects {entry.shape}")
        names = self.hf_shapes()
        for key in state:
            if key not in names and not (self.ignored and self.ignored.fullmatch(key)):
                raise ValueError(f"state dict holds {key!r}, which this model does not have "
                                 "(another configuration?)")
        return state

    def to_ours(self, state):
        """(our parameter, its array) for every parameter, once ``check`` has passed; one
        transformers tensor at a time, so that a large model is never copied whole."""
        state = self.check(state)
        for entry in self.entries:
            yield from entry.to_ours(np.asarray(state[entry.name])).items()

    def to_hf(self, get):
        """transformers' state dict, from ``get(our parameter name) -> its array``."""
        return {entry.name: entry.to_hf({p.param: get(p.param) for p in entry.pieces})
                for entry in self.entries}
