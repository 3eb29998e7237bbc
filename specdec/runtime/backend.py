"""What a model backend is to the rest of specdec: the one interface that CachedModel, the
engines and the services use, met by TorchBackend, OpenVINOBackend and
PagedOpenVINOBackend. Nothing probes a backend for what it might have: every backend has
every member here, the optional capabilities with their defaults from BackendDefaults."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


class BackendDefaults:
    """The optional capabilities' values for a backend that does not set them."""

    # Logits of a position depend on what else its pass holds (dynamic activation
    # quantization): the service reports it (common.proto ModelInfo) and contrastive
    # decoding refuses such an amateur.
    batch_dependent_logits: bool = False
    skip_layers: tuple[int, ...] = ()  # a layer-skip draft's skipped decoder layers
    inference_precision: str = "f32"  # what its passes compute in, for logs and reports
    dynamic_skip: Any = None  # a torch draft's on-the-fly layer skipping (DynamicSkip)
    head_vocab: int = 0  # an FR-Spec draft's sliced LM head: its rows; 0 = the full head
    kv_pool_bytes: int = 0  # bytes a paged KV block pool holds (0: no pool)
    prefix_cache_stats: Any = None  # a paged pool's prefix cache (None: none)


@runtime_checkable
class Backend(Protocol):
    name: str  # "torch" or "openvino" (ModelInfo.backend)
    loaded: Any  # model_id and tokenizer_digest of what it serves
    device: Any
    vocab_size: int
    max_context: int
    batch_dependent_logits: bool
    skip_layers: tuple[int, ...]
    inference_precision: str
    dynamic_skip: Any
    head_vocab: int
    kv_pool_bytes: int
    prefix_cache_stats: Any

    def new_cache(self) -> Any:
        """An empty KV cache for a new session."""

    def cache_len(self, cache: Any) -> int:
        """Positions the cache holds."""

    def crop(self, cache: Any, length: int) -> None:
        """Forget every cached position from `length` on."""

    def forward(self, cache: Any, tokens: list[int], keep_last: int = 1) -> torch.Tensor:
        """Feed `tokens` after what the cache holds; the logits of the last `keep_last`."""

    def forward_batch(self, items: list) -> list[torch.Tensor]:
        """One pass over several sessions' (cache, tokens, keep_last): each one's logits,
        as `forward` would give them."""
