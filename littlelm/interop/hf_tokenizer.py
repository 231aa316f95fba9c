"""Tokenizers in the format transformers loads (tokenizer.json + tokenizer_config.json), both ways.

Export: a BPE or Hugging Face tokenizer is saved as it is; the byte tokenizer becomes a byte-level
BPE without merges (token i = byte i, BOS = 256: the same ids); a tiktoken encoding is converted
with transformers' TikTokenConverter. Each export adds a post-processor that puts one BOS first
(for a pair of texts too), as every littlelm document starts, so `tokenizer(text)` gives what the
model was trained on; the converted tokenizer is checked to encode a probe exactly as littlelm
does, or refused. BOS is also the pad token (left padding), so batched generation works.
Import: tokenizer.json is required (a sentencepiece-only tokenizer.model is refused with the fix);
tokenizer_config.json's chat_template, when there is one, comes along (data/chat.py). Export
writes the chat format back: littlelm's template, or the imported one (`chat_config`).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from littlelm.data.chat import END, TEMPLATE, render_template
from littlelm.data.tokenizer import (
    BOS_CANDIDATES,
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    read_chat_template,
)
from littlelm.errors import CheckpointError, DataError

PROBE = "Hello, world! It's 2026 -- naïve café, 東京, emoji 🙂\n\tdef f(x): return x**2\n"


def export_rules(tok: Tokenizer) -> tuple[str, int, bool]:
    """(the eos token's text, its id, whether a text's encoding starts with BOS) as exported:
    an imported tokenizer's own (`Tokenizer.rules`), else littlelm's (eos = BOS, BOS first)."""
    eos: str | None = tok.rules.get("eos_token")
    eos_id = tok.special_id(eos) if eos else None
    if eos_id is None and eos and isinstance(tok, HFTokenizer):
        eos_id = tok.tok.token_to_id(eos)
    if eos_id is None:
        eos, eos_id = tok.bos_token, tok.bos_id
    assert eos is not None, "an eos id was found for this text"
    return eos, eos_id, tok.rules.get("adds_bos", True)


def export_tokenizer(tok: Tokenizer, out: Path) -> None:
    """tokenizer.json + tokenizer_config.json for `tok` in `out`, or a CheckpointError."""
    raw, bos = raw_tokenizer(tok)
    from tokenizers.processors import Sequence, TemplateProcessing

    eos, _, adds_bos = export_rules(tok)
    if adds_bos and raw.encode("a").ids[:1] != [
        tok.bos_id
    ]:  # BOS first, as in training (littlelm's
        template = TemplateProcessing(  # encode leaves it out: it adds BOS per document)
            # a pair is one document: no second BOS, which llama.cpp's converter would read as a
            # separator to append after every prompt (add_sep_token)
            single=f"{bos} $A",
            pair=f"{bos} $A $B",
            special_tokens=[(bos, tok.bos_id)],
        )
        old = raw.post_processor
        raw.post_processor = template if old is None else Sequence([old, template])
    raw.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,  # littlelm's: a document ends where the next one's BOS would come
        "pad_token": bos,  # batched generate pads (masked out) with the one special token
        "padding_side": "left",  # a decoder pads on the left to generate in a batch
        "clean_up_tokenization_spaces": False,
        **chat_config(tok),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def chat_config(tok: Tokenizer) -> dict:
    """The chat format for tokenizer_config.json (docs/post-training.md): littlelm's as a Jinja
    chat_template with eos_token = <|end|> (the end of an assistant turn, where generation
    stops), or an imported tokenizer's own template and special tokens; {} for a tokenizer
    with neither."""
    if tok.chat_template is not None:
        return {"chat_template": exported_template(tok), **tok.template_tokens()}
    if tok.special_id(END) is None:
        return {}
    return {"chat_template": TEMPLATE, "eos_token": END}


def exported_template(tok: Tokenizer) -> str:
    """An imported chat_template as export writes it back. littlelm trains every conversation
    after a BOS (each document starts with one), so a template that writes no BOS itself
    (ChatML, Qwen's) gets `{{ bos_token }}` in front: transformers' apply_chat_template and
    llama.cpp then render the ids the model was trained on, not the same ids less the first."""
    template = tok.chat_template
    assert template is not None
    special = {"bos_token": tok.bos_token, **tok.template_tokens()}
    probe = render_template(template, [{"role": "user", "content": "Q"}], True, special)
    return template if probe.startswith(tok.bos_token) else "{{ bos_token }}" + template


def stop_ids(tok: Tokenizer) -> list[int]:
    """The ids generation stops at: a chat model's end of turn (`<|end|>`, or the imported
    template's eos_token) first, then the tokenizer's own eos (an imported one's) or BOS, where
    a plain document ends (the next one's BOS)."""
    end = chat_config(tok).get("eos_token")
    end_id = tok.special_id(end) if end is not None else None
    own = export_rules(tok)[1]  # the tokenizer's own eos (an imported one's), else BOS
    return [own] if end_id is None or end_id == own else [end_id, own]


def raw_tokenizer(tok: Tokenizer):
    """(the tokenizers.Tokenizer with littlelm's ids, the BOS token's text), checked to encode
    as littlelm does; without the BOS post-processor (the GGUF export reads its vocabulary)."""
    from tokenizers import Tokenizer as Raw

    if isinstance(tok, HFTokenizer):
        raw, bos = Raw.from_str(tok.tok.to_str()), tok.bos_token
    elif isinstance(tok, ByteTokenizer):
        raw, bos = _byte_level(tok), "<|bos|>"
    elif tok.kind == "tiktoken":
        raw, bos = _from_tiktoken(tok), tok.bos_token
    else:
        raise CheckpointError(
            f"cannot export a {tok.kind} tokenizer to tokenizer.json; train with data.tokenizer "
            "name bpe, huggingface, tiktoken or byte to export the model"
        )
    if raw.encode(PROBE, add_special_tokens=False).ids != list(tok.encode(PROBE)):
        raise CheckpointError(
            f"the {tok.kind} tokenizer converted to tokenizer.json encodes differently from "
            "littlelm's; train with data.tokenizer name bpe or huggingface to export this model"
        )
    return raw, bos


def _byte_level(tok: ByteTokenizer):
    """Byte-level BPE with no merges: each byte one token, token id = byte value."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    raw = Tokenizer(models.BPE(vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([AddedToken("<|bos|>", special=True)])  # id 256 = tok.bos_id
    return raw


def _from_tiktoken(tok: Tokenizer):
    from transformers.integrations.tiktoken import TikTokenConverter

    from littlelm.data.tiktoken_tokenizer import TiktokenTokenizer

    assert isinstance(tok, TiktokenTokenizer), "raw_tokenizer calls this for kind tiktoken"
    specials = sorted(tok.special_tokens().items(), key=lambda kv: kv[1])
    with tempfile.TemporaryDirectory() as d:
        ranks = Path(d) / "ranks.tiktoken"
        ranks.write_bytes(tok._ranks_file())
        conv = TikTokenConverter(
            vocab_file=str(ranks),
            pattern=tok.enc._pat_str,
            extra_special_tokens=[s for s, _ in specials],
        )
        raw = conv.converted()
    wrong = [s for s, i in specials if raw.token_to_id(s) != i]
    if wrong:
        raise CheckpointError(
            f"the tiktoken encoding's special tokens {wrong} do not follow its ranks, so the "
            "converted tokenizer.json would renumber them; re-tokenize with data.tokenizer name "
            "bpe or huggingface to export this model"
        )
    return raw


def import_tokenizer(src: Path, hf_config: dict) -> HFTokenizer:
    """The tokenizer of a Hugging Face model directory, with its BOS token."""
    from littlelm.data.tokenizer import _read_tokenizer_json

    path = src / "tokenizer.json"
    if not path.is_file():
        hint = (
            " (it has only a sentencepiece tokenizer.model)"
            if (src / "tokenizer.model").is_file()
            else ""
        )
        raise CheckpointError(
            f"{src} has no tokenizer.json{hint}; save one next to the weights with "
            "transformers.AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)"
        )
    try:
        raw = _read_tokenizer_json(path)
    except DataError as e:
        raise CheckpointError(str(e)) from None
    bos = _bos_token(src, hf_config, raw)
    if bos is None:
        raise CheckpointError(
            f"{src}: no BOS-like token found (tokenizer_config.json bos_token, config.json "
            f"bos_token_id, or one of {', '.join(BOS_CANDIDATES)}); add bos_token to "
            "tokenizer_config.json"
        )
    tok = HFTokenizer(raw, bos).with_chat_template(*read_chat_template(src))
    tok.rules = {"eos_token": _eos_token(src, hf_config, raw), "adds_bos": _adds_bos(src, raw, bos)}
    return tok


def _eos_token(src: Path, hf_config: dict, raw) -> str | None:
    """tokenizer_config.json's eos_token, else config.json's eos_token_id (the first of a
    list); None when neither names a token of the vocabulary."""
    tc = src / "tokenizer_config.json"
    named = json.loads(tc.read_text()).get("eos_token") if tc.is_file() else None
    named = named.get("content") if isinstance(named, dict) else named
    if isinstance(named, str) and raw.token_to_id(named) is not None:
        return named
    eos_id = hf_config.get("eos_token_id")
    eos_id = eos_id[0] if isinstance(eos_id, list) and eos_id else eos_id
    return raw.id_to_token(eos_id) if isinstance(eos_id, int) else None


def _adds_bos(src: Path, raw, bos: str) -> bool:
    """Whether the tokenizer puts BOS before a text: tokenizer_config.json's add_bos_token
    where it says (transformers builds the post-processor from it), else what tokenizer.json's
    post-processor does."""
    tc = src / "tokenizer_config.json"
    flag = json.loads(tc.read_text()).get("add_bos_token") if tc.is_file() else None
    if isinstance(flag, bool):
        return flag
    return raw.encode("a").ids[:1] == [raw.token_to_id(bos)]


def _bos_token(src: Path, hf_config: dict, raw) -> str | None:
    """tokenizer_config.json's bos_token, else config.json's bos_token_id, else a usual name."""
    tc = src / "tokenizer_config.json"
    named = json.loads(tc.read_text()).get("bos_token") if tc.is_file() else None
    named = named.get("content") if isinstance(named, dict) else named
    if named and raw.token_to_id(named) is not None:
        return named
    bos_id = hf_config.get("bos_token_id")
    if isinstance(bos_id, int) and raw.id_to_token(bos_id) is not None:
        return raw.id_to_token(bos_id)
    return next((t for t in BOS_CANDIDATES if raw.token_to_id(t) is not None), None)
