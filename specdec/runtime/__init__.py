"""Model-facing code: backends, model loading, per-session KV caches.

Only this package imports transformers (and, later, optimum-intel / openvino), lazily.
"""
