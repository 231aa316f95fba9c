"""`littlelm serve`'s API on a model whose replies the test sets: stop strings, the openai
client's options, where a completion ends, prompts quoting special tokens, and the requests
inside the schema that once got a 500 (seeds at and past a generator's range, lone surrogates,
temperature and top_p 1e-300, a 20 MB body).

The model is a real GPT with its weights set by hand: every block adds nothing, so the logits
depend on the current token alone, and lm_head sends each token of CHAIN to the next, greedily:
a chat reply is "Hey!" then <|end|>, a completion after "H" is "ey!" then <|end|> (then "Z" for
ever, were it not stopped there); any other token is followed by BOS. The app (build_app) runs
in this process under uvicorn, on a free loopback port."""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time

import pytest
import torch

from littlelm.data.chat import ASSISTANT, CHAT_TOKENS, END
from littlelm.data.tokenizer import BPEConfig, BPETokenizer
from littlelm.eval.serve import Server, build_app
from littlelm.eval.serve_api import SEED_MAX, SEED_MIN
from littlelm.model.gpt import GPT, GPTConfig

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
requests = pytest.importorskip("requests")

KEY = "key-456"
CHAIN = [ASSISTANT, "H", "e", "y", "!", END, "Z", "Z"]  # each token's greedy successor
REPLY, COMPLETION = "Hey!", "ey!"  # to a chat; after the prompt "H"
CONTEXT = 64


def controlled_model(tok) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(name="gpt", vocab_size=tok.vocab_size, n_layer=1, d_model=32, n_head=2,
                    max_seq_len=CONTEXT)  # fmt: skip
    model = GPT(cfg).eval()
    ids = [tok.special_id(t) if t.startswith("<|") else tok.encode(t)[0] for t in CHAIN]
    assert all(len(tok.encode(t)) == 1 for t in CHAIN if not t.startswith("<|"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("c_proj.weight"):  # no block changes the residual stream
                p.zero_()
        model.wte.weight.zero_()  # a token outside the chain: all logits 0, BOS (id 0) first
        model.lm_head.weight.zero_()
        for k, (a, b) in enumerate(itertools.pairwise(ids)):  # token a: direction k, read as b
            model.wte.weight[a, k] = 1.0
            model.lm_head.weight[b, k] = 10.0
    return model


@pytest.fixture(scope="module")
def tok():
    texts = ["Reverse: a b c. Hey! Say Z and H. " * 20]
    tok = BPETokenizer.train(BPEConfig(name="bpe", vocab_size=300, train_chars=2000), iter(texts))
    assert {tok.special_id(t) for t in CHAT_TOKENS} and tok.bos_id == 0
    return tok


@pytest.fixture(scope="module")
def url(tok):
    server = Server(controlled_model(tok), tok, "ctl", contextlib.nullcontext(), max_tokens=16)
    web = uvicorn.Server(uvicorn.Config(build_app(server, KEY), host="127.0.0.1", port=0,
                                        log_level="warning"))  # fmt: skip
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not web.started and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.05)
    assert web.started, "uvicorn did not start within 30 s"
    port = web.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    web.should_exit = True
    thread.join(timeout=15)


def client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def ask(url: str, path: str, body, headers: dict | None = None) -> requests.Response:
    data = json.dumps(body) if isinstance(body, dict) else body  # else: raw text or chunks
    h = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}", **(headers or {})}
    return requests.post(url + path, data=data, headers=h, timeout=60)


CHAT = {"model": "ctl", "messages": [{"role": "user", "content": "Reverse: a b"}]}
TEXT = {"model": "ctl", "prompt": "H"}


def test_the_controlled_model_replies_as_set(url):
    r = client(url).chat.completions.create(model="ctl", messages=CHAT["messages"], temperature=0)
    assert r.choices[0].message.content == REPLY and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == len(REPLY) + 1  # its <|end|> too


def test_stop_strings_and_plain_completions(url):
    c = client(url)
    for stream in (False, True):
        r = c.chat.completions.create(model="ctl", messages=CHAT["messages"], temperature=0,
                                      max_tokens=16, stop=["ey"], stream=stream)  # fmt: skip
        if stream:
            chunks = list(r)
            text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]
        else:
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        assert (text, finish) == ("H", "stop")
    r = c.completions.create(model="ctl", prompt="H", temperature=0, max_tokens=8, stop=["y!"])
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("e", "stop")
    r = c.completions.create(model="ctl", prompt="H", temperature=0, max_tokens=8)
    s = c.completions.create(model="ctl", prompt="H", temperature=0, max_tokens=8, stream=True)
    assert r.choices[0].text == "".join(ch.choices[0].text for ch in s) == COMPLETION


def test_a_completion_on_a_chat_model_stops_at_the_end_of_a_turn(url):
    """<|end|> ends a completion as it ends a chat reply (the model would go on with "Z"s)."""
    r = client(url).completions.create(model="ctl", prompt="H", temperature=0, max_tokens=12)
    assert (r.choices[0].text, r.choices[0].finish_reason) == (COMPLETION, "stop")
    assert r.usage.completion_tokens == len(COMPLETION) + 1


def test_a_prompt_quoting_special_tokens_is_text(url, tok):
    """`<|assistant|>` typed into a completion prompt is text, not the control token (which
    would start the chat reply "Hey!")."""
    prompt = "<|assistant|>"
    r = client(url).completions.create(model="ctl", prompt=prompt, temperature=0, max_tokens=8)
    assert r.usage.prompt_tokens == 1 + len(tok.encode(prompt)) > 2
    assert r.choices[0].text == "" and r.choices[0].finish_reason == "stop"  # then BOS


def test_openai_client_options(url):
    """What the openai client sends beyond the basics: max_completion_tokens, stream_options
    (usage in a last chunk without choices), content as text parts, the `developer` role, and
    models.retrieve."""
    c = client(url)
    assert c.models.retrieve("ctl").id == "ctl"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gpt-4")
    msgs = CHAT["messages"]
    r = c.chat.completions.create(model="ctl", messages=msgs, temperature=0,
                                  max_completion_tokens=2)  # fmt: skip
    assert r.usage.completion_tokens == 2 and r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content == REPLY[:2]
    chunks = list(c.chat.completions.create(
        model="ctl", messages=msgs, temperature=0, max_tokens=16, stream=True,
        stream_options={"include_usage": True},
    ))  # fmt: skip
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(REPLY) + 1
    assert all(ch.usage is None for ch in chunks[:-1])
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == REPLY
    q = msgs[0]["content"]
    halves = [{"role": "user", "content": [{"type": "text", "text": q[:4]},
                                           {"type": "text", "text": q[4:]}]}]  # fmt: skip
    whole = c.chat.completions.create(model="ctl", messages=msgs, temperature=0)
    parts = c.chat.completions.create(model="ctl", messages=halves, temperature=0)
    assert parts.usage.prompt_tokens == whole.usage.prompt_tokens  # the parts joined
    system = [{"role": "system", "content": "Be brief."}, *msgs]
    developer = [{"role": "developer", "content": "Be brief."}, *msgs]
    used = [c.chat.completions.create(model="ctl", messages=m, temperature=0).usage.prompt_tokens
            for m in (system, developer)]  # fmt: skip
    assert used[0] == used[1] > whole.usage.prompt_tokens  # developer is read as system


def test_seeds_at_a_generators_range_are_served_and_past_it_refused(url):
    for seed in (SEED_MIN, SEED_MAX, 0):
        r = ask(url, "/v1/chat/completions", {**CHAT, "seed": seed, "max_tokens": 4})
        assert r.status_code == 200, r.text
    for seed in (SEED_MAX + 1, SEED_MIN - 1, 2**64, -(2**63) - 1, 10**30):
        for body in ({**CHAT, "seed": seed}, {**TEXT, "seed": seed}):
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            r = ask(url, path, body)
            assert r.status_code == 400 and "seed" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize(
    "path,raw",
    [
        ("/v1/chat/completions", '{"model": "ctl", "messages": [{"role": "user", "content": "a\\ud800"}]}'),
        ("/v1/chat/completions", '{"model": "ctl", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}'),
        ("/v1/chat/completions", '{"model": "ctl", "messages": [{"role": "system", "content": "\\ud800"}, {"role": "user", "content": "hi"}]}'),
        ("/v1/chat/completions", '{"model": "ctl", "stop": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}'),
        ("/v1/completions", '{"model": "ctl", "prompt": "x\\ud800y"}'),
        ("/v1/completions", '{"model": "ctl", "prompt": ["\\udc00"]}'),
        ("/v1/completions", '{"model": "\\ud800", "prompt": "x"}'),
    ],
)  # fmt: skip
def test_lone_surrogates_are_refused_as_text_that_is_not_unicode(url, path, raw):
    r = ask(url, path, raw)
    assert r.status_code == 400, r.text
    assert "lone surrogate" in r.json()["error"]["message"]


@pytest.mark.parametrize("setting", [{"temperature": 1e-300}, {"top_p": 1e-300},
                                     {"temperature": 5e-324, "top_p": 1e-300}])  # fmt: skip
def test_a_tiny_temperature_or_top_p_is_greedy(url, setting):
    for path, body, want in (("/v1/chat/completions", CHAT, REPLY),
                             ("/v1/completions", TEXT, COMPLETION)):  # fmt: skip
        for stream in (False, True):
            r = ask(url, path, {**body, **setting, "seed": 1, "stream": stream})
            assert r.status_code == 200, r.text
            if not stream:
                choice = r.json()["choices"][0]
                assert choice.get("text", choice.get("message", {}).get("content")) == want
            else:
                assert "generation failed" not in r.text and r.text.endswith("data: [DONE]\n\n")


def test_a_huge_request_is_refused_before_it_is_read_and_others_are_served(url, tok):
    limit_hint = "this server takes at most"
    huge = json.dumps({"model": "ctl", "prompt": "ab " * 7_000_000})  # about 20 MB
    r = ask(url, "/v1/completions", huge)
    assert r.status_code == 413 and limit_hint in r.json()["error"]["message"], r.text[:300]

    def chunked():  # no Content-Length: refused as the body passes the limit
        yield huge[:1000].encode()
        for i in range(1000, len(huge), 1 << 20):
            yield huge[i : i + (1 << 20)].encode()

    r = ask(url, "/v1/completions", chunked())
    assert r.status_code == 413 and limit_hint in r.json()["error"]["message"], r.text[:300]
    # within the body limit but longer than any prompt that fits the context: refused before
    # tokenizing, by its length
    long = "ab " * 20_000
    for path, body in (("/v1/completions", {**TEXT, "prompt": long}),
                       ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": long}]})):  # fmt: skip
        r = ask(url, path, body)
        assert r.status_code == 400 and "context" in r.json()["error"]["message"], r.text
    r = client(url).chat.completions.create(model="ctl", messages=CHAT["messages"], temperature=0)
    assert r.choices[0].message.content == REPLY
