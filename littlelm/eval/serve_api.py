"""What `littlelm serve` (eval/serve.py) accepts and how it refuses: the requests' schema
(OpenAI's names, validated by pydantic), the OpenAI-style error, the FastAPI error handlers, and
the limit on a request's size.

Every request inside the schema gets an answer, never a 500: a seed is within what a torch
generator takes (-2**63 .. 2**64 - 1), text is valid Unicode (JSON may carry a lone surrogate,
which no tokenizer can encode), and a body larger than the server's limit is refused before it
is read as JSON (the limit follows the model's context: a prompt that fits it fits the limit).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes
MIN_BODY = 1 << 20  # bytes a request body may always have (a long conversation's JSON)
JSON_CHAR = 6  # bytes a character may take in a JSON body at most (an escape: \uXXXX)


def valid_unicode(text: str) -> str:
    """`text`, refused when it holds a lone surrogate (JSON's "\\ud800"): it has no UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"holds a lone surrogate (\\u{ord(text[e.start]):04x} at character {e.start}), "
            "which is not Unicode text: send the text's characters (or a pair of surrogates)"
        ) from None
    return text


Text = Annotated[str, AfterValidator(valid_unicode)]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    """A message; its content a string or OpenAI's list of text parts (joined), and the role
    `developer` (OpenAI's newer name for the system message) read as `system`."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]

    @field_validator("role")
    @classmethod
    def _system(cls, role: str) -> str:
        return "system" if role == "developer" else role

    @field_validator("content")
    @classmethod
    def _text(cls, content: str | list[TextPart]) -> str:
        return content if isinstance(content, str) else "".join(p.text for p in content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class Sampling(BaseModel):
    """What both endpoints take (OpenAI's names); unknown fields are ignored, as OpenAI's
    clients send some this server has no use for."""

    model_config = ConfigDict(extra="ignore")
    model: Text
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    n: int = Field(1, ge=1, le=1)


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(Sampling):
    prompt: Text | list[Text]


class ApiError(Exception):
    """A request the server answers with `status` and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str = ""):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = {401: "authentication_error", 404: "not_found_error"}.get(
            self.status, "invalid_request_error"
        )
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.code or None}}  # fmt: skip


def stops_of(req: Sampling) -> list[str]:
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > 4 or any(not s for s in stops):
        raise ApiError(400, "stop: at most 4 non-empty strings", "stop")
    return stops


def body_limit(context: int, token_chars: int) -> int:
    """Bytes a request body may have: what the longest prompt that fits a `context`-token
    model (`token_chars` characters a token at most) takes as JSON, and MIN_BODY more."""
    return MIN_BODY + JSON_CHAR * context * max(token_chars, 1)


def add_error_handlers(app) -> None:
    """Every error an OpenAI-style JSON body: ours (ApiError), a request outside the schema
    (400, naming the first problem), the framework's (404, 405, ...), and a bug (500, said,
    not a traceback; the server serves on)."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError):
        errors = e.errors()
        # a field of several types (a string or a list of parts) has a problem for each: the
        # one a validator of ours raised says what is wrong, not "should be a valid list"
        first = next((x for x in errors if x.get("type") == "value_error"), None)
        first = first or (errors[0] if errors else {})
        where: str | None = ".".join(  # the field's path, without pydantic's type tags
            str(p) for p in first.get("loc", ()) if p != "body" and "[" not in str(p)
        )
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            message, where = "the body is not valid JSON", None
        n = len(errors)
        more = f" (and {n - 1} more problem(s))" if n > 1 else ""
        err = ApiError(400, f"{where + ': ' if where else ''}{message}{more}", where or None)
        return JSONResponse(err.body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, e: HTTPException):
        err = ApiError(e.status_code, str(e.detail))
        return JSONResponse(err.body(), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, e: Exception):  # a bug: said, not a traceback, and serving on
        err = ApiError(500, f"internal error: {type(e).__name__}: {e}"[:300], code="internal")
        return JSONResponse(err.body(), status_code=500)


class BodyLimit:
    """ASGI middleware: a request whose body is over `limit` bytes is answered 413 before it is
    parsed: at once by its Content-Length, else as soon as what arrived passes the limit. A body
    within it is read here and handed on whole; what the client sends later (its going away,
    which stops a streamed reply) is handed on as it comes."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            return await self.refuse(int(length), scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: nobody to answer
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await self.refuse(None, scope, receive, send)
        read = False

        async def replay():
            nonlocal read
            if not read:
                read = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    async def refuse(self, size: int | None, scope, receive, send) -> None:
        from starlette.responses import JSONResponse

        said = f"{size:,} bytes" if size is not None else f"over {self.limit:,} bytes"
        err = ApiError(
            413, f"the request body is {said}; this server takes at most {self.limit:,} (a "
            "prompt longer than the model's context could not be answered anyway): shorten it",
            None, "request_too_large",
        )  # fmt: skip
        await JSONResponse(err.body(), status_code=413)(scope, receive, send)
