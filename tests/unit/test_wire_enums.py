"""Domain enums and the generated protobuf enums agree on their numbers."""

from specdec.v1 import generate_pb2
from specdec.verify import TokenKind


def test_token_kind_values_match_the_proto():
    for kind in TokenKind:
        assert generate_pb2.TokenKind.Value(f"TOKEN_KIND_{kind.name}") == kind.value
