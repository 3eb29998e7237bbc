"""The draft service: proposes K tokens and the exact sparse q it sampled them from."""
