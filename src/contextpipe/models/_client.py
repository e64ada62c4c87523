"""The chassis every vendor client stands on: its connection, and one ladder from failures to `ModelError`s.

A vendor module (`openai`, `openai_responses`, `anthropic`) keeps only its wire format and its stream
assembly. What they all need is here, written once, after pydantic-ai's model / provider split:

- `Vendor`: what one vendor's API is called and says (its SDK package, environment variables, and
  the words its error messages differ in);
- `Connection`: an SDK client, who owns it (and so closes it), and the provider it speaks for;
- `ClientModel`: the base of the clients: name, default settings, media types, ``close`` and
  ``async with``, `ModelInfo` for telemetry;
- `Connection.translate` and `status_error`: SDK exceptions and HTTP statuses to the most specific
  `ModelError`, with a hint saying what to do;
- `model_name`, `retry_after`, `error_detail`, `dropped_notes`, `stream_cut`, `stream_unfinished`,
  and `IMAGE_TYPES` (the image types every vendor reads inline).

The OpenAI connection, which both OpenAI modules use (with Azure), is `models._openai`; Claude's
(with Bedrock and Vertex AI) stays in `models.anthropic`. Nothing here imports a vendor SDK: a
`Vendor` imports its own on first use.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, Self, TypeVar

from .. import errors
from .._media import IMAGE_TYPES
from ..errors import ModelError, UsageError
from .base import ModelInfo, ModelRequest, ModelSettings

__all__ = ["IMAGE_TYPES", "ClientModel", "Connection", "SDKClient", "Vendor", "dropped_notes", "error_detail",
           "model_name", "retry_after", "status_error", "stream_cut", "stream_unfinished"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Vendor:
    """What one vendor's API is called and says: its SDK, its environment variables, its errors' words."""

    label: str
    """The vendor in the install hint (``OpenAI``)."""
    package: str
    """The SDK package and the contextpipe extra that installs it (``openai``)."""
    error_base: str
    """The SDK's root exception class (``OpenAIError``)."""
    key_env: str
    """The environment variable of the API key (``OPENAI_API_KEY``)."""
    url_env: str
    """The environment variable of the base URL (``OPENAI_BASE_URL``)."""
    answer: str
    """What a well-formed answer is called (``chat completion``)."""
    keyless: str = ""
    """Said after "no API key: set ... or pass api_key=..." (how to go without a key)."""
    reach: str = "the network"
    """What to check besides the base URL when the server cannot be reached."""
    model_words: str = "model name"
    """What to check when the API answers 404 for the model."""
    window_hint: str = "History(store, max_messages=...)"
    """How to bound what is sent, when the request is larger than the context window."""
    overflow_phrases: tuple[str, ...] = ("context window", "too many tokens", "prompt is too long")
    """Lower-case fragments of an error that says the request is larger than the context window."""
    overflow_codes: tuple[str, ...] = ()
    """Error codes that say the same."""
    overloaded: int | None = None
    """The status the API answers when it is overloaded (Anthropic's 529), if it has one."""
    too_large: bool = False
    """Whether a 413 says the request's bytes (images, documents) are too many."""
    stream_statuses: Mapping[str, int] = field(default_factory=dict)
    """The HTTP status of each error type an ``error`` event in a stream may carry."""

    def sdk(self) -> Any:
        """Import and return the SDK, or raise `UsageError` naming the extra that installs it."""
        try:
            return importlib.import_module(self.package)
        except ImportError as exc:  # pragma: no cover - exercised only without the extra
            raise UsageError(f'the {self.label} client needs the {self.package} package: '
                             f'pip install "contextpipe[{self.package}]"') from exc

    def credentials(self, api_key: str | None, base_url: str | None) -> tuple[str, str | None]:
        """Return the API key and base URL from the arguments or the environment.

        A base URL without a key is a local server or a proxy, which takes any key.
        """
        base_url = base_url or os.environ.get(self.url_env) or None
        api_key = api_key or os.environ.get(self.key_env)
        if not api_key:
            if base_url is None:
                raise UsageError(f"no API key: set {self.key_env} or pass api_key=...{self.keyless}")
            api_key = "unused"
        return api_key, base_url

    def overflows(self, code: object, detail: str) -> bool:
        """Whether an error (its code and message) says the request is larger than the context window."""
        lowered = detail.lower()
        return code in self.overflow_codes or any(s in lowered for s in self.overflow_phrases)


def model_name(model: str | None, env: str, example: str) -> str:
    """Return the model name from the argument or `env`, or raise `UsageError` showing `example`."""
    name = model or os.environ.get(env) or ""
    if not name:
        raise UsageError(f"no model name: pass {example} or set {env}")
    return name


class SDKClient(Protocol):
    """What the chassis uses of a vendor SDK's async client."""

    @property
    def base_url(self) -> Any:
        """The URL requests go to."""
        ...

    async def close(self) -> None:
        """Close the HTTP connections."""
        ...


ClientT = TypeVar("ClientT", bound=SDKClient)


@dataclass(frozen=True, slots=True)
class Connection(Generic[ClientT]):
    """An SDK client, who owns it, and the provider it speaks for (pydantic-ai calls this the provider).

    `provider` is OpenTelemetry's ``gen_ai.provider.name`` (``openai``, ``azure.ai.openai``,
    ``anthropic``, ``aws.bedrock``, ``gcp.vertex_ai``). A connection that built its client owns it
    and closes it; a client passed in is closed by whoever made it.
    """

    client: ClientT
    """The SDK client."""
    vendor: Vendor
    """The vendor whose API the client speaks."""
    provider: str
    """The provider, as OpenTelemetry's ``gen_ai.provider.name`` spells it."""
    owned: bool
    """Whether `close` closes the client."""

    @property
    def sdk(self) -> Any:
        """The SDK module (its exception classes)."""
        return self.vendor.sdk()

    @property
    def where(self) -> str:
        """The provider and its endpoint, as error messages name them: ``openai (http://.../v1/)``."""
        return f"{self.provider} ({self.client.base_url})"

    async def close(self) -> None:
        """Close the client, if this connection owns it."""
        if self.owned:
            await self.client.close()

    def translate(self, exc: Exception, model: str, *, streamed: int = 0) -> ModelError:
        """Map an SDK (or transport) exception to the most specific `ModelError`.

        `streamed` counts the stream events already received: after the first, a lost connection
        is a cut stream (`stream_cut`).
        """
        sdk, vendor, provider, where = self.sdk, self.vendor, self.provider, self.where
        if isinstance(exc, ModelError):
            return exc
        if isinstance(exc, sdk.APITimeoutError):
            return errors.ModelTimeout(f"{where} did not answer {self._waited()} for model {model!r}; raise "
                                       "timeout=... or retry later", provider=provider)
        if isinstance(exc, sdk.APIConnectionError):
            if streamed:
                return stream_cut(provider, model, streamed, "event", exc)
            return errors.ModelConnectionError(f"could not reach {where}: {errors.clause(exc)}; check base_url / "
                                               f"{vendor.url_env} "
                                               f"and {vendor.reach}", provider=provider)
        if isinstance(exc, sdk.APIResponseValidationError):
            return errors.ModelResponseError(f"{where} sent a response that is not a valid {vendor.answer}: {exc}",
                                             provider=provider, status_code=exc.status_code, body=exc.body)
        if isinstance(exc, sdk.APIStatusError):
            return self._status_error(exc, model, streamed)
        if isinstance(exc, ValueError | TypeError | KeyError):
            return errors.ModelResponseError(f"{where} sent a response that could not be read: {exc}",
                                             provider=provider)
        if isinstance(exc, getattr(sdk, vendor.error_base)):
            return ModelError(f"{where}: {exc}", provider=provider)
        if streamed:
            return stream_cut(provider, model, streamed, "event", exc)
        # Transport errors the SDK did not wrap.
        return errors.ModelConnectionError(f"the connection to {where} failed while reading the response: "
                                           f"{type(exc).__name__}: {exc}", provider=provider)

    def _waited(self) -> str:
        """How long the client waited: ``within 60 s (3 attempts)``, from its timeout and retry count."""
        timeout, retries = getattr(self.client, "timeout", None), getattr(self.client, "max_retries", 0)
        seconds = getattr(timeout, "read", timeout)  # an httpx.Timeout, or a number
        if not isinstance(seconds, int | float):
            return "in time"
        attempts = f" ({retries + 1} attempts)" if isinstance(retries, int) and retries > 0 else ""
        return f"within {seconds:g} s{attempts}"

    def _status_error(self, exc: Any, model: str, streamed: int) -> ModelError:
        """Map an HTTP error answer, or an ``error`` event in a stream (status 200), with `status_error`."""
        status = exc.status_code
        error_type, detail = error_detail(exc.body, exc)
        if status == 200 and self.vendor.stream_statuses:
            status = self.vendor.stream_statuses.get(error_type if isinstance(error_type, str) else "", 500)
            detail = f"{detail} (sent in the stream after {streamed} event(s))"
        return status_error(status, detail, where=self.where, model=model, provider=self.provider, vendor=self.vendor,
                            body=exc.body, headers=exc.response.headers, code=getattr(exc, "code", None))


def status_error(status: int, detail: str, *, where: str, model: str, provider: str, vendor: Vendor,
                 body: Any = None, headers: Any = None, code: object = None) -> ModelError:
    """Return the `ModelError` for an HTTP error answer, with a hint saying what to do.

    401/403 `ModelAuthError`; 429 `ModelRateLimited` (with ``retry_after`` from the headers); the
    vendor's overloaded status and 5xx `ModelServerError`; 413 (where the vendor means too many bytes)
    and 404 and the rest `ModelBadRequest`; an error saying the prompt is too long
    `ContextWindowExceeded`.
    """
    info: dict[str, Any] = {"provider": provider, "status_code": status, "body": body}
    detail = errors.clause(detail)  # "Not found." is followed by "; check ..."
    if status in (401, 403):
        return errors.ModelAuthError(f"{where} refused the credentials (HTTP {status}): {detail}; check "
                                     f"{vendor.key_env} / api_key and that the key may use this model", **info)
    if status == 429:
        wait = retry_after(headers) if headers is not None else None
        hint = f"retry after {wait:g} s" if wait is not None else "retry later"
        return errors.ModelRateLimited(f"{where} is rate limiting (HTTP 429): {detail}; {hint}", retry_after=wait,
                                       **info)
    if status == vendor.overloaded:
        return errors.ModelServerError(f"{where} is overloaded (HTTP {status}): {detail}; retry in a little while",
                                       **info)
    if status >= 500:
        return errors.ModelServerError(f"{where} failed with HTTP {status}: {detail}; retry later", **info)
    if status == 413 and vendor.too_large:
        return errors.ModelBadRequest(f"the request is larger than {where} accepts (HTTP 413): {detail}; send fewer "
                                      "or smaller images and documents", **info)
    if vendor.overflows(code, detail):
        return errors.ContextWindowExceeded(
            f"the request is larger than the context window of model {model!r}: {detail}; bound what is sent "
            f"({vendor.window_hint}) or use a model with a larger window", **info)
    if status == 404:
        return errors.ModelBadRequest(f"{where} answered 404 for model {model!r}: {detail}; check the "
                                      f"{vendor.model_words} and the base URL", **info)
    return errors.ModelBadRequest(f"{where} rejected the request (HTTP {status}): {detail}", **info)


def error_detail(body: Any, exc: object) -> tuple[str | None, str]:
    """Return the error type and message of an error answer's body (``{"error": {"type", "message"}}``)."""
    if isinstance(body, dict):
        inner = body["error"] if isinstance(body.get("error"), dict) else body
        if inner.get("message"):
            return inner.get("type"), str(inner["message"])
    return None, str(getattr(exc, "message", exc))


def retry_after(headers: Any) -> float | None:
    """Return the seconds to wait that ``retry-after-ms`` or ``retry-after`` say, or None."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) * scale
        except ValueError:
            continue
    return None


def dropped_notes(dropped: Mapping[str, int], who: str) -> list[str]:
    """One note per kind of part left out (keys ``part:KIND`` for content parts, else reasoning formats)."""
    notes = []
    for key, count in sorted(dropped.items()):
        what = f"part(s) of kind {key[5:]!r}" if key.startswith("part:") else f"reasoning part(s) of format {key!r}"
        notes.append(f"left out {count} {what}: {who} cannot accept them")
    return notes


def stream_cut(provider: str, model: str, received: int, unit: str, exc: BaseException) -> errors.ModelResponseError:
    """Return the error of a stream cut after `received` chunks or events (the call can be retried)."""
    return errors.ModelResponseError(f"the {provider} stream for model {model!r} was cut after {received} {unit}(s) "
                                     f"({type(exc).__name__}: {errors.clause(exc)}); retry the call", provider=provider)


def stream_unfinished(provider: str, model: str, how: str) -> errors.ModelResponseError:
    """Return the error of a stream that ended `how` (``after 5 event(s) without message_stop``)."""
    return errors.ModelResponseError(f"the {provider} stream for model {model!r} ended {how}; the connection was "
                                     "probably cut: retry the call", provider=provider)


class ClientModel(Generic[ClientT]):
    """The base of the vendor clients: the model name, default settings, media types and the connection.

    A vendor client adds its wire format (``complete``, ``stream``). It closes the client it built
    (``await model.close()`` or ``async with model``), never one passed in.
    """

    def __init__(self, model: str, connection: Connection[ClientT], settings: ModelSettings | None,
                 media_types: Sequence[str] | None) -> None:
        self._model = model
        self._connection = connection
        self.settings: ModelSettings = settings or ModelSettings()
        """Default settings for every call; a request's settings override them."""
        self.media_types = None if media_types is None else tuple(media_types)
        """Patterns of the media types this model reads in tool results (None: whatever the API takes)."""

    def _adopt(self, client: ClientT, provider: str) -> Self:
        """Take `client` (built by a factory such as ``azure``) as this model's own, speaking for `provider`."""
        self._connection = Connection(client, self._connection.vendor, provider, owned=True)
        return self

    @property
    def name(self) -> str:
        """The model (or Azure deployment, or Bedrock model id) name."""
        return self._model

    @property
    def client(self) -> ClientT:
        """The underlying SDK client."""
        return self._connection.client

    @property
    def provider(self) -> str:
        """The provider as OpenTelemetry's ``gen_ai.provider.name`` names it (``openai``, ``aws.bedrock``, ...)."""
        return self._connection.provider

    @property
    def info(self) -> ModelInfo:
        """Who serves this model: the provider and the endpoint, for telemetry."""
        return ModelInfo(self._connection.provider, str(self._connection.client.base_url))

    async def close(self) -> None:
        """Close the HTTP client, unless it was passed in (then its owner closes it)."""
        await self._connection.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _settings(self, request: ModelRequest) -> ModelSettings:
        """Return this model's default settings with the request's over them."""
        return self.settings | request.settings if self.settings else request.settings

    def _translate(self, exc: Exception, *, streamed: int = 0) -> ModelError:
        return self._connection.translate(exc, self._model, streamed=streamed)
