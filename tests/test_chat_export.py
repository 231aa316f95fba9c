"""An SFT'd model's chat behaviour outside littlelm, judged by the other tools with their
defaults: transformers' plain `generate()` and `apply_chat_template` on the Hugging Face export,
llama.cpp's chat completion (llama-cpp-python, no chat handler given) on the GGUF."""

from __future__ import annotations

import pytest
import torch
from test_chat import sft_trees

from conftest import judge, write_config
from littlelm.data.chat import chat_format
from littlelm.interop.hf import export
from littlelm.load import load_model
from littlelm.model.generate import generate
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer

transformers = pytest.importorskip("transformers")

LLAMA = dict(mlp="swiglu", qk_norm=False, softcap=None, residual_scalars=False, value_embeds=False)
QUESTIONS = [
    [{"role": "user", "content": "Reverse: a b"}],
    [{"role": "user", "content": "Reverse: c d e"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Reverse: h g"}],
    [{"role": "user", "content": "Reverse: a b c d"}],
    [
        {"role": "user", "content": "Reverse: f e"},
        {"role": "assistant", "content": "e f"},
        {"role": "user", "content": "Reverse: b c a"},
    ],
]
NEW = 16  # new tokens at most: a reply of the 40-step model below ends in fewer


@pytest.fixture(scope="module", params=["littlelm", "llama"])
def sft_model(request, tmp_path_factory):
    """(run dir, arch): an SFT run trained long enough (40 steps) that its greedy replies end
    with the end-of-turn token, on the littlelm architecture or a Llama-shaped one."""
    root = tmp_path_factory.mktemp(f"sft-{request.param}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LITTLELM_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        base_features = LLAMA if request.param == "llama" else {}
        _, tree = sft_trees(root, **base_features)
        tree["train"]["max_steps"] = 40
        tree["eval"]["every"] = tree["checkpoint"]["every"] = 1000
        Trainer(load_run(write_config(root / "sft.yaml", tree)), resume="never").fit()
    return root / "runs" / "sft", request.param


def littlelm_replies(run) -> tuple[list[list[int]], list[list[int]], object]:
    """(prompt ids, greedy reply ids up to and including the end token) per question, in
    fp32 (as `littlelm chat --precision fp32` computes), and the chat format."""
    model, tok, _ = load_model(run, "cpu")
    fmt = chat_format(tok)
    prompts = [fmt.encode(q, add_generation_prompt=True) for q in QUESTIONS]
    with torch.no_grad():
        replies = [generate(model, p, NEW, 0.0, stop=fmt.end) for p in prompts]
    assert sum(fmt.end in r for r in replies) >= 3  # the model does stop: the check can fail
    return prompts, replies, fmt


def test_plain_generate_of_the_export_stops_at_the_reply_end(sft_model, tmp_path):
    run, arch = sft_model
    prompts, replies, _ = littlelm_replies(run)
    out = tmp_path / "hf"
    export(run, out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert (type(hf).__name__ == "LlamaForCausalLM") == (arch == "llama")
    hf_tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    for q, prompt, want in zip(QUESTIONS, prompts, replies, strict=True):
        ids = hf_tok.apply_chat_template(q, tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        assert ids == prompt  # the template renders the ids littlelm prompts with, one BOS
        with torch.no_grad():  # no eos_token_id given: generation_config.json's
            got = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW)[0, len(prompt) :]
        assert got.tolist() == want


def test_gguf_chat_completion_renders_littlelms_prompt_and_reply(sft_model, tmp_path):
    """llama.cpp through llama-cpp-python (built by scripts/setup-llama-cpp.sh; CI requires it):
    create_chat_completion with no chat_format or handler uses the GGUF's chat template."""
    run, arch = sft_model
    if arch != "llama":
        pytest.skip("the littlelm architecture has no GGUF form (export refuses it)")
    llama_cpp = judge("llama_cpp")
    prompts, replies, fmt = littlelm_replies(run)
    gguf = tmp_path / "model.gguf"
    export(run, None, gguf=gguf, gguf_type="f32")
    llm = llama_cpp.Llama(str(gguf), n_ctx=96, verbose=False)
    assert llm.chat_format == "chat_template.default"  # not the llama-2 fallback
    seen = []
    real = llm.create_completion

    def spy(prompt, *args, **kwargs):  # the ids the chat handler hands the model
        seen.append(list(prompt))
        return real(prompt, *args, **kwargs)

    llm.create_completion = spy
    tok = fmt.tokenizer
    for q, prompt, want in zip(QUESTIONS, prompts, replies, strict=True):
        r = llm.create_chat_completion(messages=q, temperature=0.0, max_tokens=NEW)
        assert seen[-1] == prompt  # exactly littlelm's prompt: one BOS, the same ids
        text = tok.decode([i for i in want if i != fmt.end])
        assert r["choices"][0]["message"]["content"] == text
        assert r["choices"][0]["finish_reason"] == ("stop" if fmt.end in want else "length")
