"""coordinator.deploy.config.with_environment: mounted-Secret paths from SPECDEC_<FIELD>."""

from __future__ import annotations

import pytest

from coordinator.deploy.config import CoordinatorConfig, with_environment


def test_environment_fills_fields_left_at_their_default():
    env = {"SPECDEC_TLS_CA": "/etc/specdec/tls/ca.crt", "SPECDEC_API_KEYS": "/keys/keys",
           "SPECDEC_API_KEY_CONCURRENCY": "3", "SPECDEC_PORT": "1"}
    out = CoordinatorConfig(**with_environment({"target": "t:1"}, env))
    assert (out.tls_ca, out.api_keys, out.api_key_concurrency) == \
        ("/etc/specdec/tls/ca.crt", "/keys/keys", 3)
    assert out.port == CoordinatorConfig().port  # not an environment field


def test_args_win_over_the_environment():
    out = with_environment({"tls_ca": "/given/ca.crt"}, {"SPECDEC_TLS_CA": "/env/ca.crt"})
    assert out["tls_ca"] == "/given/ca.crt"


def test_a_bad_number_names_the_variable():
    with pytest.raises(ValueError, match="SPECDEC_API_KEY_CONCURRENCY"):
        with_environment({}, {"SPECDEC_API_KEY_CONCURRENCY": "many"})
