"""The torch backend: a transformers causal LM with one DynamicCache per session.

A backend turns "feed these tokens after what the cache holds" into logits, and can
crop a cache back to a prefix. Engines speak only this interface (`new_cache`,
`forward`, `forward_batch`, `crop`), so other runtimes (OpenVINO) plug in beside it.

`forward_batch` runs several sessions in one pass. Each session keeps its own cache;
for the pass their caches are laid side by side, padded to the longest, with a 4D
attention mask that lets every row see only its own past and its own earlier new
tokens, and explicit position ids per row. Afterwards each session's cache gets only
its own new entries.
"""

from __future__ import annotations

import torch

from specdec.runtime.backend import BackendDefaults
from specdec.runtime.batching import Item
from specdec.runtime.models import LoadedModel


class TorchBackend(BackendDefaults):
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

    @torch.inference_mode()
    def forward_batch(self, items: list[Item]) -> list[torch.Tensor]:
        """Several sessions in one forward pass: float32 logits [keep_last, V] each."""
        if len(items) == 1:
            return [self.forward(*items[0])]
        from transformers import DynamicCache

        pasts = [self.cache_len(c) for c, _, _ in items]
        lengths = [len(t) for _, t, _ in items]
        width, fed = max(pasts), max(lengths)
        rows = len(items)
        batched = DynamicCache(config=self.model.config)
        if width:
            longest = items[pasts.index(width)][0]
            for layer in range(len(longest.layers)):
                template = longest.layers[layer].keys[:, :, :0]
                keys, values = [], []
                for (cache, _, _), past in zip(items, pasts, strict=True):
                    k, v = _layer(cache, layer, past, template)
                    pad = (0, 0, 0, width - past)  # pad the sequence axis at its end
                    keys.append(torch.nn.functional.pad(k, pad))
                    values.append(torch.nn.functional.pad(v, pad))
                batched.update(torch.cat(keys), torch.cat(values), layer)
        ids = torch.zeros(rows, fed, dtype=torch.long)
        positions = torch.zeros(rows, fed, dtype=torch.long)
        allowed = torch.zeros(rows, 1, fed, width + fed, dtype=torch.bool)
        causal = torch.ones(fed, fed, dtype=torch.bool).tril()
        for i, ((_, tokens, _), past, n) in enumerate(zip(items, pasts, lengths, strict=True)):
            ids[i, :n] = torch.tensor(tokens, dtype=torch.long)
            positions[i] = torch.arange(past, past + fed)
            allowed[i, 0, :, :past] = True
            allowed[i, 0, :, width:] = causal
        dtype = next(self.model.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(
            ~allowed, torch.finfo(dtype).min)
        out = self.model(input_ids=ids.to(self.device), position_ids=positions.to(self.device),
                         attention_mask=mask.to(self.device), past_key_values=batched,
                         use_cache=True)
        results = []
        for i, ((cache, _, keep_last), n) in enumerate(zip(items, lengths, strict=True)):
            for layer in range(len(batched.layers)):
                k, v = batched.layers[layer].keys, batched.layers[layer].values
                cache.update(k[i:i + 1, :, width:width + n], v[i:i + 1, :, width:width + n],
                             layer)
            results.append(out.logits[i, n - keep_last:n].float().cpu())
        return results


def _layer(cache, layer: int, past: int, empty: torch.Tensor):
    """The keys and values a session's cache holds in one layer ([1, heads, past, dim])."""
    if past == 0:
        return empty, empty
    entry = cache.layers[layer]
    return entry.keys[:, :, :past], entry.values[:, :, :past]
