"""The open-ended prompt set of `specdec eval` (issue 14): raw-text continuations, sent
as `GenerateRequest.prompt` (no chat template), in the spirit of the open-ended
generation set-ups of Li et al. 2022 and O'Brien & Lewis 2023. Fixed, and not tuned to
any result: each starts a sentence that many different texts could continue."""

from __future__ import annotations

PROMPTS: list[str] = [
    "Large language models are",
    "A good recipe for Halloween is",
    "The history of the city begins",
    "When I opened the door, I saw",
    "The most important thing about learning to play the piano is",
]

# Sampling seeds (one generation per prompt and seed for sampled modes; greedy modes are
# repeated for timing only).
SEEDS: list[int] = [1, 2, 3, 4, 5]

QUICK_PROMPTS = 2
QUICK_SEEDS = 1
