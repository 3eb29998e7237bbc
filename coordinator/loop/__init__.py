"""The speculative decoding loop: every live generation of a coordinator replica in
lockstep steps (coordinator.loop.engine), behind SpeculativeLoop's per-generation API."""

from coordinator.loop.speculative import LoopResult, LoopStats, RoundOutput, SpeculativeLoop

__all__ = ["LoopResult", "LoopStats", "RoundOutput", "SpeculativeLoop"]
