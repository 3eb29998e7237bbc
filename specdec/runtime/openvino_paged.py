"""The OpenVINO backend with a paged KV cache: many sessions in one forward pass.

The stateful IR is turned into its PagedAttention form at load time (OpenVINO's
`paged_attention_transformation`, the same graph OpenVINO GenAI's continuous batching
runs). The KV cache is then an input the model writes into: one pool of fixed-size
blocks per layer (`key_cache.N` / `value_cache.N`, [blocks, kv_heads, block_size,
head_dim] on CPU), shared by every session. A session is a block table and a length
(`specdec.runtime.blocks`). One infer takes the tokens of several sessions end to end,
ragged, with no padding:

  input_ids, position_ids   every session's new tokens, concatenated
  past_lens                 how many positions each session holds already
  subsequence_begins        where each session's tokens start in input_ids (+ the end)
  block_indices(_begins)    every session's block table, concatenated (+ offsets)
  max_context_len           the longest session after this pass

and returns logits for the positions asked for (`logits_indices`, a Gather we insert
before the LM head: a prefill then computes one row of the 49k-wide head, not one per
prompt token; the saving measured: docs/design.md, section 14). Rolling back is setting a
shorter length: no gather, no compaction, and the next tokens overwrite the dead
entries. Each session's attention reads only its own blocks, so a session's logits do
not depend on which others share the pass beyond float rounding in the shared matmuls
(measured and tested: tests/runtime/test_batched_forward.py).

Automatic prefix caching (`prefix_cache=True`, the default; specdec.runtime.prefix_cache):
before a pass, each session is first given the cached full blocks that continue its
prefix and fed only the rest; a block that is shared or indexed is copied before a pass
writes into it (copy-on-write, every key_cache.N / value_cache.N row of it).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from specdec.runtime.blocks import BlockPool, BlockTable
from specdec.runtime.openvino_backend import OpenVINOBackend
from specdec.runtime.prefix_cache import PrefixCache, PrefixCacheStats

log = logging.getLogger(__name__)

INITIAL_BLOCKS = 64


def _kv_matching_compute(core, device: str, config: dict) -> dict:
    """The CPU plugin's paged attention wants an f32 KV cache only when it computes in
    f32; in bf16/f16 the cache must be the same 16-bit type (u8 works with either)."""
    precision = config.get("INFERENCE_PRECISION_HINT")
    if precision is None:  # "auto": what the plugin would choose
        try:
            precision = core.get_property(device, "INFERENCE_PRECISION_HINT").to_string()
        except Exception:  # noqa: BLE001 - a plugin without the property computes in f32
            precision = "f32"
    if precision in ("bf16", "f16") and config.get("KV_CACHE_PRECISION") == "f32":
        log.info("paged KV cache in %s, the precision this model computes in", precision)
        config = {**config, "KV_CACHE_PRECISION": precision}
    return config


def _gather_before_lm_head(model) -> bool:
    """Feed the LM head only the rows named by a new `logits_indices` input; False (all
    rows are computed) when the logits do not come straight from one MatMul."""
    import openvino as ov
    import openvino.opset13 as ops

    head = model.output("logits").get_node().input_value(0).get_node()
    if head.get_type_name() != "MatMul":
        log.info("logits do not come from a MatMul; the LM head runs on every token")
        return False
    indices = ops.parameter([-1], ov.Type.i64, name="logits_indices")
    indices.output(0).get_tensor().set_names({"logits_indices"})
    head.input(0).replace_source_output(ops.gather(head.input_value(0), indices, 0).output(0))
    model.add_parameters([indices])
    model.validate_nodes_and_infer_types()
    return True


class PagedOpenVINOBackend(OpenVINOBackend):
    kv_layout = "paged"

    def __init__(self, *args, initial_blocks: int = INITIAL_BLOCKS, max_blocks: int = 0,
                 prefix_cache: bool = True, **kwargs):
        """prefix_cache: reuse full KV blocks across sessions with the same prefix."""
        self._initial_blocks, self._max_blocks = initial_blocks, max_blocks
        self._prefix_on = prefix_cache
        super().__init__(*args, **kwargs)
        # Feed every position as a one-token subsequence (_infer) where the plugin's
        # dynamic quantization would compute positions another way by how many tokens
        # their sequence is given. A draft turns it off: its logits never decide the
        # output, and a long prompt's prefill costs ~10% more this way (draft_service).
        self.one_token_rows = self.batch_dependent_logits

    def _compile(self, core, xml: Path, device: str, config: dict):
        from openvino._offline_transformations import paged_attention_transformation

        model = self._read_model(core, xml, config)
        paged_attention_transformation(model)
        self._gathers = _gather_before_lm_head(model)
        compiled = core.compile_model(model, device, _kv_matching_compute(core, device, config))
        self._request = compiled.create_infer_request()
        self._cache_inputs = [i.get_any_name() for i in compiled.inputs
                              if i.get_any_name().startswith(("key_cache.", "value_cache."))]
        if not self._cache_inputs:
            raise ValueError(f"{xml} has no attention the paged transformation could rewrite")
        shapes = {}
        for name in self._cache_inputs:
            port = compiled.input(name)
            shape = port.get_partial_shape()
            if not all(shape[i].is_static for i in range(1, shape.rank.get_length())):
                raise ValueError(f"device {device} does not fix the KV block layout "
                                 f"({name}: {shape}); use --kv-layout stateful")
            shapes[name] = ([shape[i].get_length() for i in range(1, shape.rank.get_length())],
                            port.get_element_type())
        self._block_shapes = shapes
        block_size = next(iter(shapes.values()))[0][1]
        self.pool = BlockPool(block_size, self._initial_blocks, self._max_blocks,
                              on_grow=self._grow)
        self.prefix_cache = PrefixCache(self.pool) if self._prefix_on else None
        self._tensors: dict[str, object] = {}
        self._allocate(self._initial_blocks, copy_from=None)
        return compiled

    def _allocate(self, blocks: int, copy_from: dict | None) -> None:
        import openvino as ov

        for name in self._cache_inputs:
            dims, etype = self._block_shapes[name]
            tensor = ov.Tensor(etype, [blocks, *dims])
            if copy_from is not None:
                old = copy_from[name]
                tensor.data[:old.shape[0]] = old.data
            self._tensors[name] = tensor
            self._request.set_tensor(name, tensor)

    @property
    def kv_pool_bytes(self) -> int:
        """Bytes held by the KV block pool (it grows by doubling and never shrinks)."""
        return sum(t.byte_size for t in self._tensors.values())

    def _grow(self, old: int, new: int) -> None:
        log.info("KV block pool: %d -> %d blocks of %d positions", old, new,
                 self.pool.block_size)
        self._allocate(new, copy_from=dict(self._tensors))

    def _copy_block(self, src: int, dst: int) -> None:
        for tensor in self._tensors.values():
            tensor.data[dst] = tensor.data[src]

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The prefix cache's counts; None when it is off."""
        return None if self.prefix_cache is None else self.prefix_cache.stats()

    # -- the backend interface ---------------------------------------------------------

    def new_cache(self) -> BlockTable:
        return BlockTable(self.pool)

    @staticmethod
    def cache_len(cache: BlockTable) -> int:
        return cache.length

    def crop(self, cache: BlockTable, length: int) -> None:
        cache.crop(length)

    def forward(self, cache: BlockTable, tokens: list[int], keep_last: int = 1) -> torch.Tensor:
        return self.forward_batch([(cache, tokens, keep_last)])[0]

    def forward_batch(self, items: list[tuple[BlockTable, list[int], int]]) -> list[torch.Tensor]:
        """Feed each session its tokens in one pass; logits [keep_last, V] per session.

        Each session is first given the cached blocks that continue its prefix (never
        a position whose logits are asked for) and fed the rest. Blocks are reserved,
        and shared ones copied, for all sessions before the pass (a full pool raises
        before anything is written); lengths move only after the pass succeeded: a
        failed pass leaves every session holding what it held.
        """
        starts = [cache.length for cache, _, _ in items]
        try:
            feeds = []
            for cache, tokens, keep_last in items:
                served = 0 if self.prefix_cache is None else \
                    self.prefix_cache.attach(cache, tokens, keep_last)
                feeds.append((cache, tokens[served:], keep_last))
            for cache, tokens, _ in feeds:
                cache.reserve(cache.length + len(tokens))
                cache.make_writable(cache.length, cache.length + len(tokens),
                                    self._copy_block)
            out = self._infer(feeds)
        except BaseException:
            for (cache, _, _), start in zip(items, starts, strict=True):
                cache.crop(start)  # back before what the prefix cache attached
            raise
        for cache, tokens, _ in feeds:
            cache.advance(tokens)
            if self.prefix_cache is not None:
                self.prefix_cache.commit(cache)
        return out

    def _infer(self, items: list[tuple[BlockTable, list[int], int]]) -> list[torch.Tensor]:
        """One infer over the sessions' tokens (blocks reserved); logits per session.

        With int8/int4 weights and the CPU plugin's dynamic quantization, a sequence
        given one new token in a pass is computed one way (its attention kernel) and one
        given two or more another; the activations' quantization then magnifies the
        rounding: a position's logits differed by up to ~0.34 between the two
        (Qwen2.5-Coder-1.5B, int8). With `one_token_rows`, every position goes as its own
        one-token subsequence over the session's blocks: PagedAttention writes every new
        key and value into the cache before it attends, so position i sees positions
        before it in the same pass, and each position is computed the one-token way
        whatever its pass held: bit-equal to decoding token by token, so the target's
        greedy output stays target-only's. It costs a verify nothing and a long prefill
        ~10% (docs/design.md, section 28)."""
        split = self.one_token_rows
        size = self.pool.block_size
        ids, positions, past, begins, blocks, block_begins = [], [], [], [0], [], [0]
        for cache, tokens, _ in items:
            start = cache.length
            ids.extend(tokens)
            positions.extend(range(start, start + len(tokens)))
            if split:
                for at in range(start, start + len(tokens)):
                    past.append(at)
                    begins.append(begins[-1] + 1)
                    blocks.extend(cache.blocks[:at // size + 1])
                    block_begins.append(len(blocks))
            else:
                past.append(start)
                begins.append(len(ids))
                blocks.extend(cache.blocks)
                block_begins.append(len(blocks))
        longest = max(c.length + len(t) for c, t, _ in items)
        ends = np.cumsum([len(t) for _, t, _ in items]).tolist()
        inputs = {}
        if self._gathers:
            rows = [i for (_, _, keep), end in zip(items, ends, strict=True)
                    for i in range(end - keep, end)]
            inputs["logits_indices"] = np.asarray(rows, dtype=np.int64)
        self._request.infer({
            **inputs,
            "input_ids": np.asarray(ids, dtype=np.int64),
            "position_ids": np.asarray(positions, dtype=np.int64),
            "past_lens": np.asarray(past, dtype=np.int32),
            "subsequence_begins": np.asarray(begins, dtype=np.int32),
            "block_indices": np.asarray(blocks, dtype=np.int32),
            "block_indices_begins": np.asarray(block_begins, dtype=np.int32),
            "max_context_len": np.asarray(longest, dtype=np.int32),
        })
        logits = self._request.get_tensor("logits").data  # [rows, 1, V or a head's N]
        out, row = [], 0
        for (_, _, keep_last), end in zip(items, ends, strict=True):
            first = row if self._gathers else end - keep_last
            out.append(self._rows(logits[first:first + keep_last, 0]))
            row += keep_last
        return out
