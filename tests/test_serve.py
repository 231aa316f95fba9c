"""`littlelm serve`, judged by the official openai client (its streamed and plain replies are
`littlelm chat`'s), by concurrent clients, by 30 bad requests, and by a real browser on the chat
page (Debian's chromium + chromium-driver through selenium; skipped without them unless
LITTLELM_REQUIRE names `browser`, as .ci/run does). The server runs in its own process on a
free loopback port; every wait is bounded."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
from test_chat import sft_trees

from conftest import judge, write_config
from littlelm.cli import main
from littlelm.eval.chat import Chat
from littlelm.load import load_model
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
requests = pytest.importorskip("requests")

QUESTIONS = ["Reverse: a b", "Reverse: c d e", "Reverse: h g", "Reverse: a b c d", "Reverse: f e"]
KEY = "test-key-123"
DONE = ".msg.assistant[data-done='true']"  # the page marks a reply done when its stream ends


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A briefly trained SFT run: the tests on it compare the server's replies with `littlelm
    chat`'s, whatever it learned; what needs known replies uses `controlled` below."""
    root = tmp_path_factory.mktemp("serve")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LITTLELM_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        _, tree = sft_trees(root)
        tree["eval"]["every"] = tree["checkpoint"]["every"] = 1000
        Trainer(load_run(write_config(root / "sft.yaml", tree)), resume="never").fit()
    return root / "runs" / "sft"


@pytest.fixture(scope="module")
def server(run):
    """(base URL, process) of `littlelm serve RUN --api-key KEY --precision fp32`."""
    port = free_port()
    cmd = [sys.executable, "-m", "littlelm", "serve", str(run), "--port", str(port)]
    cmd += ["--api-key", KEY, "--precision", "fp32", "--max-tokens", "16"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            if proc.poll() is not None:
                pytest.fail(f"littlelm serve exited: {proc.stdout.read()}")
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("littlelm serve did not answer within 60 s")
    yield url, proc
    proc.terminate()
    try:
        proc.wait(timeout=30)  # it gives requests in flight 10 s
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("littlelm serve did not stop within 30 s of SIGTERM")


@pytest.fixture(scope="module")
def expected(run) -> dict[str, str]:
    """`littlelm chat --precision fp32 --max-tokens 16`'s greedy reply to each question."""
    model, tok, _ = load_model(run, "cpu")
    return {q: Chat(model, tok, max_tokens=16).reply(q) for q in QUESTIONS}


def client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def test_openai_client_streamed_and_plain_replies_equal_chats(server, expected, run):
    url, _ = server
    c = client(url)
    assert [m.id for m in c.models.list().data] == ["sft"]
    for q, want in expected.items():
        msgs = [{"role": "user", "content": q}]
        r = c.chat.completions.create(model="sft", messages=msgs, temperature=0, max_tokens=16)
        assert r.choices[0].message.content == want
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
        parts = c.chat.completions.create(
            model="sft", messages=msgs, temperature=0, max_tokens=16, stream=True
        )
        assert "".join(ch.choices[0].delta.content or "" for ch in parts if ch.choices) == want
    # the CLI's own reply is the same (littlelm chat --precision fp32)
    q = QUESTIONS[0]
    out = subprocess.run(
        [sys.executable, "-m", "littlelm", "chat", str(run), "--prompt", q, "--precision", "fp32",
         "--max-tokens", "16"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout == expected[q] + "\n"


def test_eight_concurrent_clients_all_get_their_answers(server, expected):
    url, _ = server
    got: dict[int, str] = {}

    def ask(i: int) -> None:
        q = QUESTIONS[i % len(QUESTIONS)]
        r = client(url).chat.completions.create(
            model="sft", messages=[{"role": "user", "content": q}], temperature=0,
            max_tokens=16, stream=i % 2 == 0,
        )  # fmt: skip
        if i % 2 == 0:
            got[i] = "".join(ch.choices[0].delta.content or "" for ch in r if ch.choices)
        else:
            got[i] = r.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == {i: expected[QUESTIONS[i % len(QUESTIONS)]] for i in range(8)}


def streamed_text(response) -> str:
    """The reply text of a streamed chat completion read as raw server-sent events."""
    text = ""
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("data: ") and line != "data: [DONE]":
            choices = json.loads(line[len("data: ") :])["choices"]
            text += (choices[0]["delta"].get("content") or "") if choices else ""
    return text


def test_more_streamed_clients_than_server_threads_all_get_their_answers(server, expected):
    """48 streamed clients at once: more than the 40 worker threads the web framework lends
    blocking code. A stream must not hold a thread while it waits its turn, or the model's own
    stream finds none left and every client waits forever."""
    url, proc = server
    got: dict[int, str] = {}

    def ask(i: int) -> None:
        q = QUESTIONS[i % len(QUESTIONS)]
        body = {"model": "sft", "messages": [{"role": "user", "content": q}], "temperature": 0,
                "max_tokens": 16, "stream": True}  # fmt: skip
        with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=60,
                           headers={"Authorization": f"Bearer {KEY}"}) as r:  # fmt: skip
            got[i] = streamed_text(r)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(48)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert got == {i: expected[QUESTIONS[i % len(QUESTIONS)]] for i in range(48)}
    assert proc.poll() is None


def test_a_client_that_leaves_mid_stream_leaves_the_model_to_the_next(server, expected):
    """A streamed reply whose client closes the connection after the first event stops there
    and the next request is answered (it must not wait for a stream nobody reads)."""
    url, _ = server
    port = int(url.rsplit(":", 1)[1])
    q = QUESTIONS[0]
    for seed in range(3):
        body = json.dumps({"model": "sft", "messages": [{"role": "user", "content": q}],
                           "temperature": 2.0, "max_tokens": 64, "stream": True, "seed": seed})  # fmt: skip
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                f"{KEY}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall((head + body).encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 200")  # the headers, then away
        r = client(url).chat.completions.create(
            model="sft", messages=[{"role": "user", "content": q}], temperature=0, max_tokens=16
        )
        assert r.choices[0].message.content == expected[q]


def bad_requests() -> list[tuple[str, object, dict | None]]:
    """(path, body, headers) of 30 requests the server must refuse with a 4xx."""
    ok = {"model": "sft", "messages": [{"role": "user", "content": "Reverse: a b"}]}
    long = "Reverse: " + " ".join("abcdefgh" * 40)
    chat = "/v1/chat/completions"
    cases: list[tuple[str, object, dict | None]] = [
        (chat, "{not json", None),
        (chat, "", None),
        (chat, [1, 2], None),
        (chat, {"messages": ok["messages"]}, None),  # no model
        (chat, {"model": "sft"}, None),  # no messages
        (chat, {**ok, "messages": []}, None),
        (chat, {**ok, "messages": "hi"}, None),
        (chat, {**ok, "messages": [{"role": "wizard", "content": "x"}]}, None),
        (chat, {**ok, "messages": [{"role": "user"}]}, None),
        (chat, {**ok, "messages": [{"role": "user", "content": 5}]}, None),
        (chat, {**ok, "messages": [{"role": "user", "content": "   "}]}, None),
        (chat, {**ok, "messages": [{"role": "assistant", "content": "x"}]}, None),
        (chat, {**ok, "messages": [{"role": "user", "content": "<|end|>"}]}, None),
        (chat, {**ok, "model": "gpt-4"}, None),
        (chat, {**ok, "temperature": "hot"}, None),
        (chat, {**ok, "temperature": -1}, None),
        (chat, {**ok, "temperature": 9}, None),
        (chat, {**ok, "top_p": 0}, None),
        (chat, {**ok, "max_tokens": 0}, None),
        (chat, {**ok, "max_tokens": 10**9}, None),
        (chat, {**ok, "max_tokens": "many"}, None),
        (chat, {**ok, "n": 3}, None),
        (chat, {**ok, "stop": ["a", "b", "c", "d", "e"]}, None),
        (chat, {**ok, "stop": [""]}, None),
        (chat, {**ok, "messages": [{"role": "user", "content": long}]}, None),
        (chat, ok, {"Authorization": "Bearer wrong"}),
        (chat, ok, {}),  # no key
        ("/v1/completions", {"model": "sft"}, None),  # no prompt
        ("/v1/completions", {"model": "sft", "prompt": ["a", "b"]}, None),
        ("/v1/nothing", ok, None),
    ]
    assert len(cases) == 30
    return cases


def test_thirty_bad_requests_are_4xx_json_and_the_server_keeps_serving(server, expected):
    url, proc = server
    auth = {"Authorization": f"Bearer {KEY}"}
    for path, body, headers in bad_requests():
        data = body if isinstance(body, str) else json.dumps(body)
        h = {"Content-Type": "application/json", **(auth if headers is None else headers)}
        r = requests.post(url + path, data=data, headers=h, timeout=60)
        assert 400 <= r.status_code < 500, (path, body, r.status_code, r.text)
        err = r.json()["error"]
        assert err["message"] and "Traceback" not in r.text, (body, r.text)
    assert proc.poll() is None
    q = QUESTIONS[0]
    r = client(url).chat.completions.create(
        model="sft", messages=[{"role": "user", "content": q}], temperature=0, max_tokens=16
    )
    assert r.choices[0].message.content == expected[q]


def test_serve_refusals_name_the_fix(run, tmp_path, capsys, monkeypatch):
    assert main(["serve", str(tmp_path)]) == 2  # no checkpoint there
    assert "checkpoint" in capsys.readouterr().err
    assert main(["serve", str(run), "--max-tokens", "0"]) == 2
    assert "--max-tokens must be at least 1" in capsys.readouterr().err
    with monkeypatch.context() as mp:  # the serve extra not installed
        mp.setitem(sys.modules, "uvicorn", None)
        assert main(["serve", str(run)]) == 2
        assert "pip install 'littlelm[serve]'" in capsys.readouterr().err
    with socket.socket() as s:  # a port that is taken
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert main(["serve", str(run), "--port", str(s.getsockname()[1])]) == 2
        assert "choose another --port" in capsys.readouterr().err


def test_an_empty_api_key_or_a_port_out_of_range_is_refused(tmp_path, capsys, monkeypatch):
    """Refused before the model loads (no checkpoint is needed to be told): an empty key would
    serve without one, silently; port 99999 was an OverflowError traceback."""
    assert main(["serve", str(tmp_path), "--api-key", ""]) == 2
    assert "the API key is empty" in capsys.readouterr().err
    monkeypatch.setenv("LITTLELM_API_KEY", "")
    assert main(["serve", str(tmp_path)]) == 2
    assert "the API key is empty" in capsys.readouterr().err
    monkeypatch.delenv("LITTLELM_API_KEY")
    for port in ("99999", "65536", "0", "-1"):
        assert main(["serve", str(tmp_path), "--port", port]) == 2
        err = capsys.readouterr().err
        assert "--port must be in 1..65535" in err and "Traceback" not in err, err


def chromium() -> tuple[str, str] | None:
    """(browser, driver) paths of Debian's chromium and chromium-driver, if installed."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def test_a_browser_asks_on_the_chat_page_and_reads_the_streamed_reply(server, run):
    required = "browser" in os.environ.get("LITTLELM_REQUIRE", "").split(",")
    found = chromium()
    if found is None:
        if required:
            pytest.fail("chromium and chromium-driver are required (apt-get install chromium "
                        "chromium-driver)")  # fmt: skip
        pytest.skip("chromium / chromium-driver not installed (Debian: apt-get install ...)")
    webdriver = judge("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, _ = server
    opts = webdriver.ChromeOptions()
    opts.binary_location = found[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    service = webdriver.ChromeService(executable_path=found[1])
    browser = webdriver.Chrome(options=opts, service=service)
    try:
        browser.set_page_load_timeout(30)
        browser.get(url + "/")
        assert browser.find_element(By.ID, "title").text == "sft"
        browser.find_element(By.ID, "key").send_keys(KEY)
        model, tok, _ = load_model(run, "cpu")
        chat = Chat(model, tok, max_tokens=16)  # the page sends the whole conversation
        for i, q in enumerate(QUESTIONS[:2]):
            want = chat.reply(q)
            browser.find_element(By.ID, "question").send_keys(q)
            browser.find_element(By.ID, "send").click()
            WebDriverWait(browser, 60).until(
                lambda b, n=i + 1: len(b.find_elements(By.CSS_SELECTOR, DONE)) == n
            )
            reply = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]
            assert reply.get_attribute("textContent") == want
        assert not browser.find_elements(By.CSS_SELECTOR, ".error")
    finally:
        browser.quit()


def test_stop_strings_are_cut_wherever_they_fall_across_pieces():
    from littlelm.eval.serve import cut_at_stops

    rng = random.Random(0)
    text = "the cat sat<|end|> on the mat; the dog ran"
    for stops in (["<|end|>"], ["sat", "dog"], ["mat;", "t"], ["zzz"], ["ran"], ["n", "dog ran"]):
        found = [text.find(s) for s in stops if s in text]
        want = text[: min(found)] if found else text
        for _ in range(50):  # the text split into random pieces, as a tokenizer's may be
            cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, 12)))
            pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
            out = list(cut_at_stops(iter(pieces), stops))
            assert "".join(t for t, _ in out) == want
            assert (out[-1] == ("", "stop")) == bool(found)
