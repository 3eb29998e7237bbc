"""The torch backend: a transformers causal LM with one DynamicCache per session.

A backend turns "feed these tokens after what the cache holds" into logits, and can
crop a cache back to a prefix. Engines speak only this interface (`new_cache`,
`forward`, `crop`), so other runtimes (OpenVINO) plug in beside it.
"""

from __future__ import annotations

import torch

from specdec.runtime.models import LoadedModel


class TorchBackend:
    name = "torch"

    def __init__(self, loaded: LoadedModel, device: str = "cpu"):
        self.loaded = loaded
        self.model = loaded.model
        self.device = torch.device(device)
        self.vocab_size = loaded.vocab_size
        self.max_context = loaded.max_context

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @staticmethod
    def cache_len(cache) -> int:
        return int(cache.get_seq_length())

    def crop(self, cache, length: int) -> None:
        """Forget every cached position from `length` on."""
        if self.cache_len(cache) > length:
            cache.crop(length)

    @torch.inference_mode()
    def forward(self, cache, tokens: list[int], keep_last: int = 1) -> torch.Tensor:
        """Feed `tokens` after the cache's contents (one forward pass, cache extended).

        Returns float32 logits [keep_last, V] for the last `keep_last` fed positions
        (the LM head runs on those only).
        """
        past = self.cache_len(cache)
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        positions = torch.arange(past, past + len(tokens), device=self.device)
        out = self.model(
            input_ids=ids,
            position_ids=positions.unsqueeze(0),
            cache_position=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=keep_last,
        )
        return out.logits[0, -keep_last:].float().cpu()
