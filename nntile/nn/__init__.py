"""Layers of tiled tensors: each holds parameter and gradient tensors and submits tensor ops."""
from nntile.nn.layers import (Attention, Block, Embedding, LayerNorm, Linear, MLP, PreNormBlock,
                              RMSNorm, Rotary)
from nntile.nn.module import Module, Parameter

__all__ = ["Attention", "Block", "Embedding", "LayerNorm", "Linear", "MLP", "Module",
           "Parameter", "PreNormBlock", "RMSNorm", "Rotary"]
