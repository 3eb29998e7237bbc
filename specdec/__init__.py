"""specdec: distributed speculative decoding (draft and target as separate gRPC services)."""

__version__ = "0.1.0"
