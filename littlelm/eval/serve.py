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
import functools
import hmac
import json
import queue
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import torch

from littlelm.data.chat import chat_format, conversation_problem
from littlelm.errors import LittleLMError
from littlelm.eval.chat import Chat
from littlelm.eval.serve_api import (
    ApiError,
    BodyLimit,
    ChatRequest,
    CompletionRequest,
    Sampling,
    add_error_handlers,
    body_limit,
    stops_of,
)
from littlelm.model.generate import stream

PAGE = Path(__file__).with_name("serve_page.html")


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
        # the most characters a token stands for: a longer prompt cannot fit the context, and
        # is refused before it is tokenized (and its request before it is read: body_limit)
        self.token_chars = max(int(tokenizer.token_bytes().max()), 1)
        self.max_body = body_limit(self.context, self.token_chars)
        # a completion ends where its document would (the next BOS) or, on a chat model, at
        # the end of a turn, as a chat reply does
        self.ends = {tokenizer.bos_id} | ({self.format.end} if self.format else set())

    # -- requests -> (prompt ids, budget) ------------------------------------------------------

    def check_model(self, name: str) -> None:
        if name != self.name:
            raise ApiError(
                404, f"the model {name!r} does not exist; this server serves {self.name!r} "
                "(GET /v1/models)", "model", "model_not_found",
            )  # fmt: skip

    def check_length(self, chars: int, param: str) -> None:
        """Refuse a prompt of `chars` characters that no tokenization fits into the context."""
        if chars > self.context * self.token_chars:
            raise ApiError(
                400, f"the prompt is {chars:,} characters: more than the model's "
                f"{self.context}-token context holds ({self.token_chars} characters a token at "
                "most); shorten it", param, "context_length_exceeded",
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
        self.check_length(sum(len(m["content"]) for m in messages), "messages")
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
        self.check_length(len(text), "prompt")
        tok = self.tokenizer
        # a document starts with BOS, as in training; special-token text in the prompt is
        # ordinary text (tokenizer.encode): a client's text never makes control tokens
        prompt = [tok.bos_id, *tok.encode(text)]
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
        steps = stream(model, logits, caches, budget, req.temperature, None, gen, None, top_p)
        try:
            for nxt in steps:
                if nxt in self.ends:  # the next document's BOS, or a chat turn's end
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


def build_app(server: Server, api_key: str | None = None):
    """The FastAPI application serving `server`: the error handlers, the body limit and the key
    check, then each endpoint (one function each, below)."""
    from fastapi import FastAPI

    app = FastAPI(title="littlelm", docs_url=None, redoc_url=None, openapi_url=None)
    add_error_handlers(app)
    add_key_check(app, api_key)
    app.add_middleware(BodyLimit, limit=server.max_body)  # added last: it runs first
    add_page(app, server, api_key)
    add_models(app, server)
    add_chat_completions(app, server)
    add_completions(app, server)
    return app


def add_key_check(app, api_key: str | None) -> None:
    """With a key, every /v1 request must carry `Authorization: Bearer KEY`."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @app.middleware("http")
    async def authorize(request: Request, call_next):
        if api_key and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, f"Bearer {api_key}".encode()):  # constant time
                err = ApiError(401, "a valid API key is required: send 'Authorization: Bearer "
                               "KEY' (the key littlelm serve was started with)", code="invalid_api_key")  # fmt: skip
                return JSONResponse(err.body(), status_code=401)
        return await call_next(request)


def add_page(app, server: Server, api_key: str | None) -> None:
    """GET /: the chat page (serve_page.html), told the model's name and whether a key is needed."""
    from fastapi.responses import HTMLResponse

    @app.get("/", response_class=HTMLResponse)
    def page():
        html = PAGE.read_text().replace("__MODEL__", json.dumps(server.name))
        return html.replace("__NEEDS_KEY__", "true" if api_key else "false")


def add_models(app, server: Server) -> None:
    """GET /v1/models and /v1/models/NAME: the one model served."""
    entry = {"id": server.name, "object": "model", "created": 0, "owned_by": "littlelm"}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [entry]}

    @app.get("/v1/models/{name:path}")
    def one_model(name: str):
        server.check_model(name)
        return entry


def add_chat_completions(app, server: Server) -> None:
    """POST /v1/chat/completions: a reply in the model's chat format."""
    from starlette.concurrency import run_in_threadpool

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest):
        server.check_model(req.model)
        stops_of(req)  # refused before any tokenizing
        pieces, usage = await run_in_threadpool(server.chat_pieces, req)
        return await respond(server, "chat", req, pieces, usage)


def add_completions(app, server: Server) -> None:
    """POST /v1/completions: plain text continued from BOS."""
    from starlette.concurrency import run_in_threadpool

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        server.check_model(req.model)
        stops_of(req)
        pieces, usage = await run_in_threadpool(server.completion_pieces, req)
        return await respond(server, "text", req, pieces, usage)


class Reply:
    """How one request's answer is written: its id, object names and choices (OpenAI's shapes
    for a chat or a text completion) and its usage."""

    def __init__(self, server: Server, kind: str, usage: dict):
        self.kind, self.usage, self.model = kind, usage, server.name
        self.id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.object = "chat.completion" if kind == "chat" else "text_completion"

    def choice(self, text: str, finish: str | None, delta: bool) -> dict:
        if self.kind == "chat":
            key = "delta" if delta else "message"
            body = {"content": text} if delta else {"role": "assistant", "content": text}
            return {"index": 0, key: body, "finish_reason": finish}
        return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}

    def usage_of(self) -> dict:
        p, c = self.usage["prompt_tokens"], self.usage.get("completion_tokens", 0)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def head(self, streamed: bool) -> dict:
        obj = f"{self.object}.chunk" if streamed and self.kind == "chat" else self.object
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


async def respond(server: Server, kind: str, req: Sampling, pieces, usage: dict):
    """Queue the request's generation; its answer whole or streamed."""
    job = server.submit(Job(pieces, stops_of(req)))
    reply = Reply(server, kind, usage)
    if not req.stream:
        return await whole(job, reply)
    return job_stream(events(job, reply, req), job)


async def whole(job: Job, reply: Reply) -> dict:
    parts, finish = [], None
    try:
        async for text, fin in job.results():
            parts.append(text)
            finish = fin or finish
    finally:
        job.cancel()
    finish = finish or reply.usage.get("finish", "length")
    return {**reply.head(False), "choices": [reply.choice("".join(parts), finish, False)],
            "usage": reply.usage_of()}  # fmt: skip


async def events(job: Job, reply: Reply, req: Sampling) -> AsyncIterator[str]:
    """The server-sent events of a streamed answer, ending with [DONE]."""
    chunk = reply.head(True)

    def event(choices: list, **more) -> str:
        return f"data: {json.dumps({**chunk, 'choices': choices, **more})}\n\n"

    if reply.kind == "chat":  # the role first, as OpenAI's stream does
        yield event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                      "finish_reason": None}])  # fmt: skip
    finish = None
    try:
        async for text, fin in job.results():
            finish = fin or finish
            if text:
                yield event([reply.choice(text, None, True)])
    except Exception as e:  # after the headers went out: an error event, then the end
        err = ApiError(500, f"generation failed: {type(e).__name__}: {e}"[:300])
        yield f"data: {json.dumps(err.body())}\n\n"
    else:
        yield event([reply.choice("", finish or reply.usage.get("finish", "length"), True)])
        if req.stream_options and req.stream_options.include_usage:
            yield event([], usage=reply.usage_of())  # OpenAI's last chunk: no choices, usage
    yield "data: [DONE]\n\n"


def job_stream(events: AsyncIterator[str], job: Job):
    """A streamed response of `events`; however it ends (done, the client gone, an error), the
    job is cancelled: a generation nobody reads stops at its next piece."""
    return _job_stream_class()(events, job)


@functools.cache
def _job_stream_class():  # made on first use: fastapi and starlette are an optional extra
    from starlette.responses import StreamingResponse

    class JobStream(StreamingResponse):
        def __init__(self, events: AsyncIterator[str], job: Job):
            super().__init__(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
            self.job = job

        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            finally:
                self.job.cancel()

    return JobStream


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
    if api_key is not None and not api_key.strip():  # '' would serve without a key, silently
        raise LittleLMError(
            "the API key is empty (--api-key '' or an empty $LITTLELM_API_KEY): give a key, or "
            "leave both unset to serve without one"
        )
    if not 1 <= port <= 65535:
        raise LittleLMError(f"--port must be in 1..65535, got {port}")
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
