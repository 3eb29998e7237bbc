"""The target service: verifies K drafted tokens in one forward pass."""
