"""`specdec bench`: specdec against target-only and in-process peers, side by side."""
