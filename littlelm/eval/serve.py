"""`littlelm serve RUN`: an OpenAI-compatible HTTP server for a littlelm model, and a chat page.

    littlelm serve runs/demo-sft                        # http://127.0.0.1:8000, page at /
    littlelm serve runs/demo-sft --port 9000 --api-key "$KEY"

Endpoints: `GET /v1/models`, `POST /v1/chat/completions` (the model's chat format, data/chat.py)
and `POST /v1/completions` (plain text continued from BOS), each streamed (server-sent events,
`stream: true`) or not, with temperature, top_p, max_tokens, stop and seed. A chat reply is
`littlelm chat`'s: the same Chat (eval/chat.py), prompt, KV cache and sampling.

Built on FastAPI and uvicorn (the stack most Python model servers use; pydantic validates the
requests, as it validates littlelm's configs). One model serves one request at a time: one
generation thread takes the requests from a queue in turn (first come, first served) and hands
each its text through the event loop, so concurrent clients all get their answers, none
disturbs another's KV cache, and a waiting client holds no thread. A client that goes away
stops its generation at the next token. Every bad request is a 4xx answer with an OpenAI-style
JSON error body (`{"error": {"message", "type", "param", "code"}}`); the server never answers
with a traceback and keeps serving.

Bound to 127.0.0.1 unless `--host` says otherwise; with an API key (`--api-key` or
$LITTLELM_API_KEY) every /v1 request must carry `Authorization: Bearer KEY`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import queue
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from littlelm.data.chat import chat_format, conversation_problem
from littlelm.errors import LittleLMError
from littlelm.eval.chat import Chat
from littlelm.model.generate import stream

PAGE = Path(__file__).with_name("serve_page.html")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """A message; its content a string or OpenAI's list of text parts (joined), and the role
    `developer` (OpenAI's newer name for the system message) read as `system`."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

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
    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=1)


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(Sampling):
    prompt: str | list[str]


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


END = object()  # what a job's queue holds after its last piece


class Job:
    """One request's generation: the generation thread runs `pieces` cut at `stops` and hands
    each (text, finish) to the request's event loop, then END (or the exception that ended it).
    `cancel` (the client went away) stops it at the next piece, or before it starts."""

    def __init__(self, pieces: Generator[str, None, None], stops: list[str]):
        self.pieces, self.stops = pieces, stops
        self.loop = asyncio.get_running_loop()
        self.out: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()

    def put(self, item) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the server is shutting down
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)

    def cancel(self) -> None:
        self.cancelled.set()

    async def results(self) -> AsyncIterator[tuple[str, str | None]]:
        while (item := await self.out.get()) is not END:
            if isinstance(item, BaseException):
                raise item
            yield item


class Server:
    """The model, its tokenizer, and the thread that generates for one request at a time."""

    def __init__(self, model, tokenizer, name: str, autocast, max_tokens: int = 512):
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.autocast, self.max_tokens = autocast, max_tokens
        self.jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        threading.Thread(target=self._work, name="littlelm-generate", daemon=True).start()
        self.format = None
        with contextlib.suppress(LittleLMError):  # a base model still serves /v1/completions
            self.format = chat_format(tokenizer)
        self.context = model.cfg.max_seq_len

    # -- requests -> (prompt ids, budget) ------------------------------------------------------

    def check_model(self, name: str) -> None:
        if name != self.name:
            raise ApiError(
                404, f"the model {name!r} does not exist; this server serves {self.name!r} "
                "(GET /v1/models)", "model", "model_not_found",
            )  # fmt: skip

    def budget(self, req: Sampling, prompt_tokens: int) -> int:
        """The tokens a reply may take: what the request asks (default: the server's cap),
        refused when it does not fit the context after the prompt."""
        room = self.context - prompt_tokens
        if room < 1:
            raise ApiError(
                400, f"the prompt is {prompt_tokens} tokens and the model's context is "
                f"{self.context}: shorten the conversation", "messages", "context_length_exceeded",
            )  # fmt: skip
        asked = req.max_completion_tokens or req.max_tokens
        if asked is not None and asked > room:
            raise ApiError(
                400, f"max_tokens is {asked}, but the prompt ({prompt_tokens} tokens) leaves "
                f"{room} of the model's {self.context}-token context: ask for at most {room}",
                "max_tokens", "context_length_exceeded",
            )  # fmt: skip
        return asked or min(self.max_tokens, room)

    # -- generation: text pieces, cut at a stop string ------------------------------------------

    def chat_pieces(self, req: ChatRequest) -> tuple[Generator[str, None, None], dict]:
        if self.format is None:
            raise ApiError(
                400, f"{self.name} has no chat format (a base model): use /v1/completions, or "
                "fine-tune it first (docs/post-training.md)", "messages", "no_chat_format",
            )  # fmt: skip
        messages = [m.model_dump() for m in req.messages]
        if messages[-1]["role"] != "user":
            raise ApiError(400, "the last message must be the user's (the turn to answer)",
                           "messages")  # fmt: skip
        problem = conversation_problem([*messages, {"role": "assistant", "content": "-"}])
        if problem is not None:
            raise ApiError(400, f"messages: {problem[0]}: {problem[1]}", "messages")
        prompt = self.format.encode(messages, add_generation_prompt=True)
        budget = self.budget(req, len(prompt))
        chat = Chat(self.model, self.tokenizer, None, req.temperature, None,
                    req.top_p if req.top_p < 1 else None, budget, req.seed)  # fmt: skip
        chat.messages = messages
        usage: dict[str, int | str | None] = {"prompt_tokens": len(prompt)}  # finish: a word

        def pieces() -> Generator[str, None, None]:
            try:
                yield from chat.pieces()
            finally:  # also when a stop string closed it early
                usage["completion_tokens"], usage["finish"] = chat.generated, chat.finish

        return pieces(), usage

    def completion_pieces(self, req: CompletionRequest) -> tuple[Generator[str, None, None], dict]:
        text = req.prompt if isinstance(req.prompt, str) else "".join(req.prompt[:1])
        if isinstance(req.prompt, list) and len(req.prompt) != 1:
            raise ApiError(400, "prompt: give one string (batches of prompts are not served)",
                           "prompt")  # fmt: skip
        tok = self.tokenizer
        prompt = [tok.bos_id, *tok.encode(text)]  # a document starts with BOS, as in training
        budget = self.budget(req, len(prompt))
        usage = {"prompt_tokens": len(prompt)}
        return self._complete(prompt, budget, req, usage), usage

    @torch.no_grad()  # on a generator: around each step, whichever thread runs it
    def _complete(self, prompt: list[int], budget: int, req: Sampling, usage: dict):
        tok, model = self.tokenizer, self.model
        device = model.wte.weight.device
        gen = torch.Generator(device=device)
        if req.seed is not None:
            gen.manual_seed(req.seed)
        top_p = req.top_p if req.top_p < 1 else None
        caches = model.new_caches(1, len(prompt) + budget)
        logits = model(torch.tensor([prompt], device=device), caches=caches)[:, -1]
        ids: list[int] = []
        shown, usage["finish"] = "", "length"
        steps = stream(model, logits, caches, budget, req.temperature, None, gen, tok.bos_id, top_p)
        try:
            for nxt in steps:
                if nxt == tok.bos_id:  # the document ends where the next one would start
                    usage["finish"] = "stop"
                    break
                ids.append(nxt)
                out = tok.decode(ids)
                if not out.endswith("\ufffd"):  # a character completed
                    yield out[len(shown) :]
                    shown = out
            rest = tok.decode(ids)[len(shown) :]
            if rest:
                yield rest
        finally:  # also when a stop string closed it early
            usage["completion_tokens"] = len(ids) + (usage["finish"] == "stop")

    def submit(self, job: Job) -> Job:
        self.jobs.put(job)
        return job

    def _work(self) -> None:
        """The generation thread: the queued jobs in turn, each in the autocast context (which
        is per thread: every step of every job runs here)."""
        while True:
            job = self.jobs.get()
            try:
                if not job.cancelled.is_set():  # its client left while it waited
                    with self.autocast:
                        for item in cut_at_stops(job.pieces, job.stops):
                            job.put(item)
                            if job.cancelled.is_set():
                                break
            except Exception as e:  # that request's error; the thread serves on
                job.put(e)
            finally:
                job.pieces.close()  # a generator: stop generating
                job.put(END)


def cut_at_stops(pieces: Iterator[str], stops: list[str]) -> Iterator[tuple[str, str | None]]:
    """(text, None) pieces of `pieces`, and ("", "stop") when a stop string ends the text
    (before it, wherever the string falls across pieces). Text that may be the start of a stop
    string is held back until it is not."""
    hold = max((len(s) for s in stops), default=1) - 1
    text, sent = "", 0
    for piece in pieces:
        text += piece
        cut = min((text.find(s) for s in stops if s in text), default=-1)
        if cut >= 0:
            if cut > sent:
                yield text[sent:cut], None
            yield "", "stop"
            return
        if len(text) - hold > sent:
            yield text[sent : len(text) - hold], None
            sent = len(text) - hold
    if len(text) > sent:
        yield text[sent:], None


def stops_of(req: Sampling) -> list[str]:
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > 4 or any(not s for s in stops):
        raise ApiError(400, "stop: at most 4 non-empty strings", "stop")
    return stops


def build_app(server: Server, api_key: str | None = None):
    """The FastAPI application serving `server`."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException

    app = FastAPI(title="littlelm", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        where: str | None = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            message, where = "the body is not valid JSON", None
        n = len(e.errors())
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

    @app.middleware("http")
    async def authorize(request: Request, call_next):
        if api_key and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, f"Bearer {api_key}".encode()):  # constant time
                err = ApiError(401, "a valid API key is required: send 'Authorization: Bearer "
                               "KEY' (the key littlelm serve was started with)", code="invalid_api_key")  # fmt: skip
                return JSONResponse(err.body(), status_code=401)
        return await call_next(request)

    @app.get("/", response_class=HTMLResponse)
    def page():
        html = PAGE.read_text().replace("__MODEL__", json.dumps(server.name))
        return html.replace("__NEEDS_KEY__", "true" if api_key else "false")

    entry = {"id": server.name, "object": "model", "created": 0, "owned_by": "littlelm"}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [entry]}

    @app.get("/v1/models/{name:path}")
    def one_model(name: str):
        server.check_model(name)
        return entry

    class JobStream(StreamingResponse):
        """Server-sent events of a job; however the response ends (done, the client gone,
        an error), the job is cancelled: a generation nobody reads stops at its next piece."""

        def __init__(self, events: AsyncIterator[str], job: Job):
            super().__init__(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
            self.job = job

        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            finally:
                self.job.cancel()

    async def respond(kind: str, req: Sampling, pieces, usage: dict):
        stops = stops_of(req)
        job = server.submit(Job(pieces, stops))
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created, obj = int(time.time()), "chat.completion" if kind == "chat" else "text_completion"

        def choice(text: str, finish: str | None, delta: bool) -> dict:
            if kind == "chat":
                key = "delta" if delta else "message"
                body = {"content": text} if delta else {"role": "assistant", "content": text}
                return {"index": 0, key: body, "finish_reason": finish}
            return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}

        def usage_of() -> dict:
            p, c = usage["prompt_tokens"], usage.get("completion_tokens", 0)
            return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

        if not req.stream:
            parts, finish = [], None
            try:
                async for text, fin in job.results():
                    parts.append(text)
                    finish = fin or finish
            finally:
                job.cancel()
            finish = finish or usage.get("finish", "length")
            return {"id": rid, "object": obj, "created": created, "model": server.name,
                    "choices": [choice("".join(parts), finish, False)], "usage": usage_of()}  # fmt: skip

        chunk = {"id": rid, "object": f"{obj}.chunk" if kind == "chat" else obj,
                 "created": created, "model": server.name}  # fmt: skip

        def event(choices: list, **more) -> str:
            return f"data: {json.dumps({**chunk, 'choices': choices, **more})}\n\n"

        async def events() -> AsyncIterator[str]:
            if kind == "chat":  # the role first, as OpenAI's stream does
                yield event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "finish_reason": None}])  # fmt: skip
            finish = None
            try:
                async for text, fin in job.results():
                    finish = fin or finish
                    if text:
                        yield event([choice(text, None, True)])
            except Exception as e:  # after the headers went out: an error event, then the end
                err = ApiError(500, f"generation failed: {type(e).__name__}: {e}"[:300])
                yield f"data: {json.dumps(err.body())}\n\n"
            else:
                yield event([choice("", finish or usage.get("finish", "length"), True)])
                if req.stream_options and req.stream_options.include_usage:
                    yield event([], usage=usage_of())  # OpenAI's last chunk: no choices, usage
            yield "data: [DONE]\n\n"

        return JobStream(events(), job)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest):
        server.check_model(req.model)
        stops_of(req)  # refused before any tokenizing
        pieces, usage = await run_in_threadpool(server.chat_pieces, req)
        return await respond("chat", req, pieces, usage)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        server.check_model(req.model)
        stops_of(req)
        pieces, usage = await run_in_threadpool(server.completion_pieces, req)
        return await respond("text", req, pieces, usage)

    return app


def serve(
    checkpoint: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    device: str = "auto",
    precision: str = "auto",
    max_tokens: int = 512,
    name: str | None = None,
) -> int:
    """`littlelm serve`: load the model, then serve until interrupted."""
    from littlelm.extras import require

    require("fastapi", "serve", "littlelm serve")
    require("uvicorn", "serve", "littlelm serve")
    import uvicorn

    from littlelm.load import find_checkpoint, load_model
    from littlelm.train.device import autocast, inference_precision, pick_device

    if max_tokens < 1:
        raise LittleLMError(f"--max-tokens must be at least 1, got {max_tokens}")
    path = find_checkpoint(checkpoint)
    check_port(host, port)  # before loading takes the user's time
    dev = pick_device(device)
    model, tok, cfg = load_model(path, dev)
    name = name or run_name(Path(checkpoint))
    precision = inference_precision(precision, cfg.train.precision, dev)
    server = Server(model, tok, name, autocast(dev, precision), max_tokens)
    where = f"http://{host}:{port}"
    print(
        f"serving {name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
        f"{dev.type}, {precision}, context {server.context}) at {where}: chat page {where}/, "
        f"OpenAI API {where}/v1" + (" (API key required)" if api_key else ""),
        flush=True,
    )
    if not api_key and host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: anyone who can reach {host}:{port} may use the model; --api-key KEY "
              "(or $LITTLELM_API_KEY) makes requests carry a key", file=sys.stderr, flush=True)  # fmt: skip
    # Ctrl-C / SIGTERM: requests in flight get 10 s to finish, then are cancelled (and their
    # generations stopped), so a long queue does not keep a stopped server alive
    uvicorn.run(build_app(server, api_key), host=host, port=port, log_level="warning",
                timeout_graceful_shutdown=10)  # fmt: skip
    return 0


def run_name(path: Path) -> str:
    """The model's name in the API: its run directory's name (a checkpoint's run's)."""
    path = path.expanduser().resolve()
    if path.parent.name == "checkpoints":
        path = path.parent.parent
    return path.name


def check_port(host: str, port: int) -> None:
    """Refuse a port that is taken before loading takes the user's time (a clear error)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise LittleLMError(
                f"cannot listen on {host}:{port}: {e.strerror}; choose another --port (or stop "
                "what holds it)"
            ) from None
