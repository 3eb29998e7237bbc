"""Decoder layers that can be skipped pass by pass, with their KV cache kept whole.

A statically pruned draft (specdec.runtime.layer_skip) has no cache for the layers it
drops. A draft that changes its skip set during a generation (skipping on the fly, SWIFT,
Xia et al. 2024; CLaSp, 2025) would leave holes in the cache of every layer it skipped
for some positions and runs again later. Here a skipped layer still writes its keys and
values, from the hidden state that reaches it, and leaves that state unchanged: the
state propagation of CALM (Schuster et al. 2022, "Confident Adaptive Language
Modeling"). That costs the layer's norm and its K and V projections (with grouped-query
attention, a few percent of the layer), and any mix of skip sets over a session's
positions leaves a consistent cache.

Within one pass every skipped layer reads nothing it wrote, so a pass with a constant set
computes exactly what the model without those layers computes; the test checks it.
Llama-style decoders only (input_layernorm, self_attn.k_proj / v_proj, rotary).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from specdec.runtime.layer_skip import decoder_layers, validate


class SkippableLayer(nn.Module):
    """A decoder layer that, when `skip` is set, only writes its KV and passes the state."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer
        self.skip = False

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        if not self.skip:
            return self.layer(hidden_states, *args, **kwargs)
        cache = kwargs.get("past_key_values")
        if cache is not None:
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            attn = self.layer.self_attn
            x = self.layer.input_layernorm(hidden_states)
            shape = (*x.shape[:-1], -1, attn.head_dim)
            k = attn.k_proj(x).view(shape).transpose(1, 2)
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            cos, sin = kwargs["position_embeddings"]
            _, k = apply_rotary_pos_emb(k, k, cos, sin)
            cache.update(k, v, attn.layer_idx)
        return hidden_states


class DynamicSkip:
    """The model's decoder layers wrapped so that `set(skip)` chooses, before any pass,
    which of them the pass skips."""

    def __init__(self, model):
        layers = decoder_layers(model)
        self.layers = [SkippableLayer(layer) for layer in layers]
        model.model.layers = nn.ModuleList(self.layers)
        self.current: tuple[int, ...] = ()

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def set(self, skip: Iterable[int]) -> None:
        skip = tuple(sorted(set(skip)))
        if skip == self.current:
            return
        validate(skip, self.num_layers)
        chosen = set(skip)
        for i, layer in enumerate(self.layers):
            layer.skip = i in chosen
        self.current = skip
