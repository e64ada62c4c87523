"""Typed structured output: ``await agent.run(..., output_type=Model)`` returns ``result.output: Model``.

`OutputSchema` turns an output type (a pydantic model, a dataclass, a ``TypedDict``, ``list[int]``:
anything pydantic's `TypeAdapter` takes) into the JSON schema the model is asked to answer with, and
validates the model's answer against it. The schema travels as ``ModelSettings.response_format``
(Chat Completions' ``json_schema`` shape), which each client turns into its vendor's native
structured output: Chat Completions ``response_format``, Responses ``text.format``, Anthropic
``output_config.format``. A model without it (a `ScriptedModel`, a model of your own) is still
validated: an answer that does not match is sent back to the model with the errors and the schema,
at most ``output_retries`` times (`contextpipe._run.output`).

A schema whose root is not an object (``list[int]``, ``int``) is sent wrapped as
``{"response": ...}``, since the vendors want an object at the root; the wrapper is taken off again
when the answer is validated. ``strict`` is asked for only when the schema can be strict (every
property required, no free-form objects), as OpenAI's strict mode refuses other schemas.

>>> from pydantic import BaseModel
>>> class City(BaseModel):
...     name: str
...     population: int
>>> schema = OutputSchema(City)
>>> schema.response_format()["json_schema"]["name"], schema.response_format()["json_schema"]["strict"]
('City', True)
>>> schema.validate('{"name": "Suzhou", "population": 12740000}')
City(name='Suzhou', population=12740000)
"""

from __future__ import annotations

import copy
import json
import re
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import pydantic

__all__ = ["OutputSchema"]

T = TypeVar("T")

_WRAPPER = "response"
"""The property a schema whose root is not an object is sent under."""


class OutputSchema(Generic[T]):
    """The output type of a run: the JSON schema sent to the model and the validation of its answer."""

    def __init__(self, output_type: type[T]) -> None:
        import pydantic  # here: an agent that never asks for structured output never loads pydantic for it

        self.output_type = output_type
        """The type the answer is validated into."""
        self._adapter: pydantic.TypeAdapter[T] = pydantic.TypeAdapter(output_type)
        schema = self._adapter.json_schema()
        self.wrapped = schema.get("type") != "object"
        """True when the schema's root is not an object, so it is sent as ``{"response": ...}``."""
        if self.wrapped:
            defs = schema.pop("$defs", None)
            schema = {"type": "object", "properties": {_WRAPPER: schema}, "required": [_WRAPPER]}
            if defs is not None:
                schema["$defs"] = defs
        self.schema: dict[str, Any] = _closed(schema)
        """The JSON schema the model is asked to answer with (objects closed: ``additionalProperties: false``)."""
        self.strict = _can_be_strict(self.schema)
        """Whether the schema fits OpenAI's strict mode (every property required)."""
        self.name = re.sub(r"[^a-zA-Z0-9_-]", "_", getattr(output_type, "__name__", "") or "output")[:64]
        """The schema's name, as the vendors want it (letters, digits, ``_`` and ``-``)."""

    def response_format(self) -> dict[str, Any]:
        """Return the ``ModelSettings.response_format`` asking the model for this schema."""
        return {"type": "json_schema",
                "json_schema": {"name": self.name, "schema": self.schema, "strict": self.strict}}

    def validate(self, text: str) -> T:
        """Return the model's answer `text` validated into the output type; raise `pydantic.ValidationError`.

        A JSON answer inside a Markdown code fence (a model without native structured output) is
        taken out of the fence first.
        """
        text = _unfenced(text)
        if self.wrapped:
            try:
                value = json.loads(text)
            except ValueError:
                pass  # pydantic says what is wrong with it, below
            else:
                if isinstance(value, dict) and set(value) == {_WRAPPER}:
                    text = json.dumps(value[_WRAPPER])  # a bare value (the wrapper left out) is taken as well
        return self._adapter.validate_json(text)

    def correction(self, error: pydantic.ValidationError) -> str:
        """Return the message that tells the model its answer did not validate, and what to answer instead."""
        problems = "\n".join(f"- {'.'.join(map(str, e['loc'])) or '(the answer)'}: {e['msg']}"
                             for e in error.errors(include_url=False)[:20])
        return ("Your answer is not valid output. Problems:\n" + problems + "\n\nAnswer again with only a JSON "
                "value matching this JSON schema, and nothing else:\n" + json.dumps(self.schema))


def _unfenced(text: str) -> str:
    match = re.fullmatch(r"\s*```[a-zA-Z]*\s*\n(.*?)\n?```\s*", text, flags=re.DOTALL)
    return match.group(1) if match else text


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """Return `schema` with ``additionalProperties: false`` on every object that says nothing of it."""
    schema = copy.deepcopy(schema)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for item in node:
                close(item)

    close(schema)
    return schema


def _can_be_strict(node: Any) -> bool:
    """Return True when every object of `node` requires all its properties and allows no others."""
    if isinstance(node, list):
        return all(_can_be_strict(item) for item in node)
    if not isinstance(node, dict):
        return True
    if node.get("type") == "object":
        properties = node.get("properties")
        if properties is None or node.get("additionalProperties") is not False:
            return False
        if set(node.get("required", ())) != set(properties):
            return False
    return all(_can_be_strict(value) for value in node.values())
