"""Layers of tiled tensors: each holds parameter and gradient tensors and submits tensor ops.
A family's own block and MLP live beside its model, in nntile.models."""
from nntile.nn.layers import (Attention, Embedding, LayerNorm, Linear, PreNormBlock, RMSNorm,
                              Rotary)
from nntile.nn.module import Module, Parameter

__all__ = ["Attention", "Embedding", "LayerNorm", "Linear", "Module", "Parameter",
           "PreNormBlock", "RMSNorm", "Rotary"]
