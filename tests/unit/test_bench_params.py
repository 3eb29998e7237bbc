"""specdec bench-params' requests (pure): each variant's parameters reach the
GenerateRequest the services read, the JSON rows ask for JSON in the prompt, the
constrained one carries the strict schema, and the prediction rows carry the answer or
its edit."""

from __future__ import annotations

import json

import jsonschema

from specdec import wire
from specdec.sampling import SamplingParams
from specdec_tools.bench.params import (
    JSON_HINT,
    PLAIN_JSON,
    SCHEMA,
    VARIANTS,
    PredictionScenario,
    VariantScenario,
    edit,
)


def request(variant: str, speculative: bool = True):
    return VariantScenario(None, variant, speculative).request("Why?", 16, SamplingParams())


def test_each_variant_reaches_the_request():
    assert not request("plain").HasField("num_draft_tokens")  # the server's K
    assert request("plain", speculative=False).num_draft_tokens == 0
    penalties = wire.sampling_from_proto(request("penalties").sampling)
    assert penalties.presence_penalty == 0.5 and penalties.logit_bias == ((11, -2.0),)
    assert request("logprobs").logprobs == 5
    constrained = request("json_schema")
    grammar = wire.sampling_from_proto(constrained.sampling).grammar
    assert grammar.kind == "json_schema" and json.loads(grammar.spec) == SCHEMA
    assert constrained.messages[0].content == "Why?" + JSON_HINT
    unconstrained = request(PLAIN_JSON)
    assert not unconstrained.sampling.HasField("grammar")
    assert unconstrained.messages[0].content == constrained.messages[0].content
    assert set(VARIANTS) >= {"plain", "json_schema", PLAIN_JSON}


def test_the_schema_is_strict_and_valid():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["additionalProperties"] is False
    assert set(SCHEMA["required"]) == set(SCHEMA["properties"])


def test_the_prediction_rows_carry_the_answer_or_its_edit():
    answer = "One. Two three four five six seven eight nine ten eleven twelve."
    exact = PredictionScenario(None, {"Why?": answer}, edited=False)
    edited = PredictionScenario(None, {"Why?": answer}, edited=True)
    assert exact.request("Why?", 16, SamplingParams()).prediction == answer
    changed = edited.request("Why?", 16, SamplingParams()).prediction
    assert changed == edit(answer) and changed != answer
    assert "Here is one more thing to add." in changed
