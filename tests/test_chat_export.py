"""An SFT'd model's chat behaviour outside littlelm, judged by the other tools with their
defaults: transformers' plain `generate()` and `apply_chat_template` on the Hugging Face export,
llama.cpp's chat completion (llama-cpp-python, no chat handler given) on the GGUF. Three models:
the littlelm architecture and a Llama-shaped one, SFT'd from a base trained here with littlelm's
tokenizer and chat format, and an imported Qwen3 with a Qwen-style tokenizer and a ChatML template
that writes no BOS, SFT'd in its own format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_chat import sft_trees, write_conversations
from test_interop import _randomize

from conftest import judge, make_corpus, tiny_tree, write_config
from littlelm.config import to_tree
from littlelm.data.chat import chat_format
from littlelm.interop.hf import export, import_model
from littlelm.load import load_model
from littlelm.model.generate import generate
from littlelm.schema import load_run
from littlelm.train.trainer import Trainer

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.precision  # .ci/run: again with bf16 forced and with fp32
# text whose split differs between GPT-2's and Qwen's regex (digits, contractions, newlines)
PROBE = "It's 2026 -- naïve café, 東京 🙂\n\tdef f(x): return x**2\n  I'LL go 123 don't\r\n\n"

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
CLASSES = {
    "littlelm": "LittleLMForCausalLM",
    "llama": "LlamaForCausalLM",
    "chatml": "Qwen3ForCausalLM",
}

# Qwen2/2.5/3's tokenizer.json split regex and a ChatML template in the style of Qwen2.5's: a
# default system message, no BOS written (Qwen's tokenizers have none; <|endoftext|> is
# config.json's bos_token_id), <|im_end|> ending each turn and a newline after it
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def save_chatml_model(out: Path, texts: list[str]) -> None:
    """A tiny random Qwen3 saved as a Qwen chat model is: save_pretrained's weights, a
    byte-level BPE tokenizer.json (trained on `texts`) with Qwen's pre-tokenizer and NFC
    normalizer and its three special tokens after the vocabulary, and tokenizer_config.json with
    no bos_token, eos_token <|im_end|> and the ChatML template above."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, trainers
    from tokenizers import pre_tokenizers as pre

    raw = Tokenizer(models.BPE())
    raw.normalizer = normalizers.NFC()
    raw.pre_tokenizer = pre.Sequence(
        [
            pre.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    raw.decoder = decoders.ByteLevel()
    bpe = trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre.ByteLevel.alphabet(), show_progress=False
    )
    raw.train_from_iterator(texts, bpe)
    specials = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    raw.add_special_tokens([AddedToken(t, special=True) for t in specials])
    cfg = transformers.Qwen3Config(
        vocab_size=384,  # padded past the tokenizer's 323, as Qwen's checkpoints are
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=raw.token_to_id("<|endoftext|>"),
        eos_token_id=raw.token_to_id("<|im_end|>"),
    )
    model = transformers.Qwen3ForCausalLM(cfg)
    _randomize(model, 3)
    model.eval().save_pretrained(out)
    raw.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))


def chatml_sft_tree(root: Path) -> dict:
    """An imported ChatML Qwen3 (save_chatml_model) and the tree of an SFT run from it."""
    corpus = make_corpus(root / "corpus.txt")
    chats = write_conversations(root / "c.jsonl", 300)
    save_chatml_model(root / "hf", [corpus.read_text(), chats.read_text()])
    base = import_model(root / "hf", root / "runs" / "qwen")
    _, _, cfg = load_model(base["checkpoint"])
    tree = tiny_tree(corpus, root / "runs", run={"name": "sft"})
    tree["data"] = {
        "tokenizer": {"name": "saved", "path": str(base["out"])},
        "sources": {"chat": {"name": "chat", "dataset": str(chats)}},
        "val_fraction": 0.1,
        "buffer_docs": 16,
    }
    tree["model"] = to_tree(cfg)["model"]
    tree["sft"] = {"base": str(base["out"])}
    tree["train"].update(seq_len=64)  # a ChatML conversation with its system turn: ~45 tokens
    return tree


@pytest.fixture(scope="module", params=["littlelm", "llama", "chatml"])
def sft_model(request, tmp_path_factory):
    """(run dir, arch): an SFT run trained long enough (40 steps) that its greedy replies end
    with the end-of-turn token: on the littlelm architecture or a Llama-shaped one from a base
    trained here, or on an imported ChatML Qwen3."""
    root = tmp_path_factory.mktemp(f"sft-{request.param}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LITTLELM_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        if request.param == "chatml":
            tree = chatml_sft_tree(root)
        else:
            _, tree = sft_trees(root, **(LLAMA if request.param == "llama" else {}))
        tree["train"].update(max_steps=40)
        tree["eval"]["every"] = tree["checkpoint"]["every"] = 1000
        Trainer(load_run(write_config(root / "sft.yaml", tree)), resume="never").fit()
    return root / "runs" / "sft", request.param


# Two implementations of one fp32 function differ in the last bits of a logit, so where the
# model's top two logits are closer than this, greedy may pick either: a tie, not a bug.
TIE = 1e-4


def littlelm_replies(run) -> tuple[list[list[int]], list[list[int]], list[list[float]], object]:
    """(prompt ids, greedy reply ids up to and including the end token, the margin between
    the top two logits at each reply token) per question, in fp32 (as `littlelm chat
    --precision fp32` computes), and the chat format."""
    model, tok, _ = load_model(run, "cpu")
    fmt = chat_format(tok)
    prompts = [fmt.encode(q, add_generation_prompt=True) for q in QUESTIONS]
    margins = []
    with torch.no_grad():
        replies = [generate(model, p, NEW, 0.0, stop=fmt.end) for p in prompts]
        for p, r in zip(prompts, replies):
            top2 = model(torch.tensor([p + r[:-1]]))[0, len(p) - 1 :].float().topk(2).values
            margins.append((top2[:, 0] - top2[:, 1]).tolist())
    assert sum(fmt.end in r for r in replies) >= 3  # the model does stop: the check can fail
    return prompts, replies, margins, fmt


def same_greedy_reply(got: list[int], want: list[int], margins: list[float]) -> bool:
    """Whether another tool's greedy reply is littlelm's: equal, or equal up to a tie, where
    either token is the greedy one (and the rest follows from another prefix)."""
    for g, w, margin in zip(got, want, margins):
        if g != w:
            return margin < TIE
    return len(got) == len(want)  # and it stopped where littlelm stopped


def test_a_tie_is_the_only_excuse_for_another_reply():
    assert same_greedy_reply([5, 6, 2], [5, 6, 2], [1.0, 1.0, 1.0])
    assert same_greedy_reply([5, 7, 9], [5, 6, 2], [1.0, 1e-5, 1.0])  # parted at a tie
    assert not same_greedy_reply([5, 7, 2], [5, 6, 2], [1.0, 0.5, 1.0])
    assert not same_greedy_reply([5, 6, 2, 4], [5, 6, 2], [1.0, 1.0, 1.0])  # did not stop


def test_plain_generate_of_the_export_stops_at_the_reply_end(sft_model, tmp_path):
    run, arch = sft_model
    prompts, replies, margins, _ = littlelm_replies(run)
    out = tmp_path / "hf"
    export(run, out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert type(hf).__name__ == CLASSES[arch]
    hf_tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    for q, prompt, want, margin in zip(QUESTIONS, prompts, replies, margins, strict=True):
        ids = hf_tok.apply_chat_template(q, tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        assert ids == prompt  # the template renders the ids littlelm prompts with, one BOS
        with torch.no_grad():  # no eos_token_id given: generation_config.json's
            got = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW)[0, len(prompt) :]
            first = hf.generate(  # what it chose from: the forward of the whole prompt
                torch.tensor([prompt]),
                max_new_tokens=1,
                return_dict_in_generate=True,
                output_logits=True,
            ).logits[0][0]
            assert torch.allclose(first, hf(torch.tensor([prompt])).logits[0, -1], atol=1e-4)
        assert same_greedy_reply(got.tolist(), want, margin), (got.tolist(), want, margin)


def test_gguf_chat_completion_renders_littlelms_prompt_and_reply(sft_model, tmp_path):
    """llama.cpp through llama-cpp-python (built by scripts/setup-llama-cpp.sh; CI requires it):
    create_chat_completion with no chat_format or handler uses the GGUF's chat template."""
    run, arch = sft_model
    if arch == "littlelm":
        pytest.skip("the littlelm architecture has no GGUF form (export refuses it)")
    llama_cpp = judge("llama_cpp")
    prompts, replies, margins, fmt = littlelm_replies(run)
    gguf = tmp_path / "model.gguf"
    export(run, None, gguf=gguf, gguf_type="f32")
    llm = llama_cpp.Llama(str(gguf), n_ctx=128, verbose=False)
    assert llm.chat_format == "chat_template.default"  # not the llama-2 fallback
    tok = fmt.tokenizer
    # llama.cpp splits text as littlelm does (GPT-2's regex, or Qwen's for the imported model)
    assert llm.tokenize(PROBE.encode(), add_bos=False, special=False) == tok.encode(PROBE)
    seen = []
    real = llm.create_completion

    def spy(prompt, *args, **kwargs):  # the ids the chat handler hands the model
        seen.append(list(prompt))
        return real(prompt, *args, **kwargs)

    llm.create_completion = spy
    untied = 0
    for q, prompt, want, margin in zip(QUESTIONS, prompts, replies, margins, strict=True):
        r = llm.create_chat_completion(messages=q, temperature=0.0, max_tokens=NEW)
        assert seen[-1] == prompt  # exactly littlelm's prompt: one BOS, the same ids
        tie = next((i for i, m in enumerate(margin) if m < TIE), None)
        text = tok.decode([i for i in want[:tie] if i != fmt.end])  # up to a tie, if any
        if tie is not None:  # either token is greedy there: the same reply up to it
            assert r["choices"][0]["message"]["content"].startswith(text)
            continue
        untied += 1
        assert r["choices"][0]["message"]["content"] == text
        assert r["choices"][0]["finish_reason"] == ("stop" if fmt.end in want else "length")
    assert untied  # a reply was compared to its end


def test_gguf_pre_tokenizer_names_only_splits_llama_cpp_reproduces():
    """Without llama.cpp at hand: which tokenizer.json pre-tokenizers get a GGUF name."""
    from littlelm.interop.gguf_export import _pre_tokenizer

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
    split = {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated"}
    qwen = {"type": "Sequence", "pretokenizers": [{**split, "invert": False}, byte_level]}
    merges = ["a b"]
    assert _pre_tokenizer(qwen, merges) == "qwen2"
    assert _pre_tokenizer({**byte_level, "use_regex": True}, merges) == "gpt-2"
    other = {"Regex": QWEN_SPLIT.replace(r"\p{N}|", r"\p{N}{1,3}|")}  # Llama 3's digit groups
    for wrong in (
        {**qwen, "pretokenizers": [{**split, "pattern": other}, byte_level]},
        {**qwen, "pretokenizers": [{**split, "invert": True}, byte_level]},
        {**qwen, "pretokenizers": [split, {**byte_level, "use_regex": True}]},  # splits twice
        {**qwen, "pretokenizers": [split, {**byte_level, "add_prefix_space": True}]},
        {**qwen, "pretokenizers": [split]},
        {"type": "Metaspace"},
    ):
        assert _pre_tokenizer(wrong, merges) is None, wrong
