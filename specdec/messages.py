"""Wire messages and typed objects converted into each other by field name. The message
type is the schema (GenerationStats for the stats, ProposeRequest for the Propose
options): a field added to the message and to the object needs no conversion code."""

from __future__ import annotations


def message_fields(msg) -> dict:
    """Every field of `msg` by name: repeated ones as tuples, an unset field that has
    presence (an optional scalar, a message) as None."""
    out = {}
    for f in msg.DESCRIPTOR.fields:
        if f.has_presence and not msg.HasField(f.name):
            out[f.name] = None
            continue
        value = getattr(msg, f.name)
        out[f.name] = tuple(value) if hasattr(value, "extend") else value
    return out


def message_from(cls, source, **given):
    """A `cls` message from `source`'s attributes named like its fields; `given` values
    win; None, and a field `source` lacks, stay unset."""
    values = {f.name: getattr(source, f.name) for f in cls.DESCRIPTOR.fields
              if hasattr(source, f.name)}
    return cls(**{k: v for k, v in {**values, **given}.items() if v is not None})
