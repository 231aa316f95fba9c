"""DPO (train/dpo.py, data/preference.py): the preference layouts, the pair batches and their
masks, the loss and gradients against TRL's DPOTrainer on the same weights, a run that trains,
evaluates and resumes bitwise from an SFT'd base, and the config's refusals."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import judge, make_corpus, tiny_tree, write_config
from littlelm.config import validate
from littlelm.data.build import DataConfig, build_data
from littlelm.data.chat import chat_format
from littlelm.data.loader import IGNORE
from littlelm.data.preference import PairLoader, as_pair, pair_rows, reply_mask
from littlelm.errors import ConfigError, DataError
from littlelm.schema import load_run
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.dpo import DPOConfig, dpo_terms, reply_tokens, sequence_logps
from littlelm.train.trainer import Trainer

LETTERS = "abcdefgh"


def reversal_pairs(n: int, seed: int = 0) -> list[dict]:
    """Reversal pairs in HF's three layouts in turn: plain strings, conversations, and an
    implicit prompt (full conversations)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        letters = [rng.choice(LETTERS) for _ in range(rng.randint(2, 4))]
        q, good = f"Reverse: {' '.join(letters)}", " ".join(reversed(letters))
        bad = " ".join(letters) if letters != letters[::-1] else good + " a"
        user, ok, no = (
            {"role": "user", "content": q},
            {"role": "assistant", "content": good},
            {"role": "assistant", "content": bad},
        )
        if i % 3 == 0:
            rows.append({"prompt": q, "chosen": good, "rejected": bad})
        elif i % 3 == 1:
            rows.append({"prompt": [user], "chosen": [ok], "rejected": [no]})
        else:
            rows.append({"chosen": [user, ok], "rejected": [user, no]})
    return rows


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_preference_layouts_become_one_pair():
    q, user = "Reverse: a b", {"role": "user", "content": "Reverse: a b"}
    ok, no = {"role": "assistant", "content": "b a"}, {"role": "assistant", "content": "a b"}
    want = {"prompt": [user], "chosen": ok, "rejected": no}
    assert as_pair({"prompt": q, "chosen": "b a", "rejected": "a b"}) == want
    assert as_pair({"prompt": [user], "chosen": [ok], "rejected": [no]}) == want
    assert as_pair({"chosen": [user, ok], "rejected": [user, no]}) == want
    assert as_pair({"prompt": q, "chosen": [user, ok], "rejected": [user, no]}) == want
    system = as_pair({"prompt": q, "chosen": "b a", "rejected": "a b"}, system="Be brief.")
    assert isinstance(system, dict) and system["prompt"][0]["role"] == "system"
    assert as_pair({"prompt": q, "rejected": "a b"}).startswith("missing reply")
    assert as_pair({"chosen": [user, ok], "rejected": [no]}).startswith("no prompt")
    assert as_pair({"prompt": 3, "chosen": "b", "rejected": "a"}).startswith("bad prompt")
    two = as_pair({"prompt": q, "chosen": [ok, ok], "rejected": "a"})
    assert two.startswith("not one reply")
    assert as_pair({"prompt": q, "chosen": "", "rejected": "a"}).startswith("empty content")


def test_reward_accuracy_counts_a_tie_half():
    ref = torch.tensor([-40.0, -35.0, -52.0, -41.0, -30.0, -33.0])  # 3 chosen, then 3 rejected
    noise = torch.tensor([1e-5, -1e-5, 2e-6, -3e-6, 0.0, 1e-5])  # rounding: the same weights
    tokens, cfg = torch.full((6,), 5), DPOConfig()
    _, figures = dpo_terms(ref + noise, ref, tokens, cfg)
    assert figures["reward_accuracy"].tolist() == [0.5, 0.5, 0.5]
    moved = ref + torch.tensor([1.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    _, figures = dpo_terms(moved, ref, tokens, cfg)
    assert figures["reward_accuracy"].tolist() == [1.0, 0.0, 0.5]


def pref_data(tmp_path: Path, rows: list, **source) -> object:
    corpus = write_jsonl(tmp_path / "p.jsonl", rows)
    tree = {
        "tokenizer": {"name": "bpe", "vocab_size": 300, "train_chars": 3000},
        "sources": {"prefs": {"name": "preference", "dataset": str(corpus), **source}},
        "val_fraction": 0.1,
        "cache_dir": str(tmp_path / "cache"),
    }
    return build_data(validate(DataConfig, tree), log=lambda *_: None)


def test_pairs_whose_replies_are_the_same_are_bad_rows(tmp_path):
    """chosen == rejected gives the DPO loss no gradient: counted as a bad row, and a source of
    nothing else is refused."""
    same = {"prompt": "x", "chosen": "y z", "rejected": "y z"}
    assert as_pair(same).startswith("same reply")
    data = pref_data(tmp_path, [*reversal_pairs(40), same])
    assert data.pairs is not None
    assert data.pairs.manifest["skipped"] == {"preference: same reply": 1}
    rows = [{**same, "prompt": f"q{i}"} for i in range(40)]
    (tmp_path / "all").mkdir()
    with pytest.raises(DataError, match="no training documents; skipped: 40 preference: same"):
        pref_data(tmp_path / "all", rows)


def test_pairs_are_two_rows_whose_targets_are_the_last_reply_only(tmp_path):
    rows = reversal_pairs(60)
    multi = {  # a two-turn prompt: its first reply is context, never counted
        "prompt": [
            {"role": "user", "content": "Reverse: a b"},
            {"role": "assistant", "content": "b a"},
            {"role": "user", "content": "Reverse: c d"},
        ],
        "chosen": "d c",
        "rejected": "c d",
    }
    data = pref_data(tmp_path, [*rows, multi, {"prompt": "x", "chosen": "y"}])
    src = data.pairs
    assert src is not None and data.masked
    assert src.manifest["skipped"] == {"preference: missing reply": 1}
    tok, fmt = data.tokenizer, chat_format(data.tokenizer)
    loader = PairLoader(src.train + src.val, "prefs", fmt, 4, 40, seed=0)
    assert len(loader.pairs) == 61 - src.manifest["duplicates"], src.manifest
    x, y = loader.next_batch()
    assert x.shape == y.shape == (8, 40)
    for r in range(8):
        counted = y[r][y[r] != IGNORE].tolist()
        assert counted and counted[-1] == fmt.end  # the reply's content and its end token
        reply = tok.decode(counted[:-1])
        row = tok.decode([t for t in x[r].tolist() if t != tok.bos_id])
        assert row.endswith(reply) or reply in row
    last = next(p for p in loader.pairs if (p.chosen == fmt.header[0]).sum() == 2)
    assert reply_mask(last.chosen, fmt).sum() < fmt.mask(last.chosen).sum()  # two replies
    want = {r: [*tok.encode(r), fmt.end] for r in ("d c", "c d")}
    assert last.chosen[reply_mask(last.chosen, fmt)].tolist() == want["d c"]
    # chosen rows first, then the rejected rows of the same pairs
    xx, yy = pair_rows([last], 40, tok.bos_id, fmt)
    assert yy[0][yy[0] != IGNORE].tolist() == want["d c"]
    assert yy[1][yy[1] != IGNORE].tolist() == want["c d"]
    n = len(last.chosen) - len(want["d c"])
    assert torch.equal(xx[0, :n], xx[1, :n]) and (xx[0, len(last.chosen) :] == tok.bos_id).all()


def test_loader_resumes_exactly_and_reorders_each_epoch(tmp_path):
    data = pref_data(tmp_path, reversal_pairs(30))
    fmt = chat_format(data.tokenizer)
    a = PairLoader(data.pairs.train, "prefs", fmt, 4, 40, seed=3)
    first = [a.next_batch()[0] for _ in range(3)]
    state = a.state_dict()
    rest = [a.next_batch()[0] for _ in range(10)]  # into the next epochs
    b = PairLoader(data.pairs.train, "prefs", fmt, 4, 40, seed=3)
    b.load_state_dict(state)
    assert all(torch.equal(p, q) for p, q in zip(rest, [b.next_batch()[0] for _ in range(10)]))
    c = PairLoader(data.pairs.train, "prefs", fmt, 4, 40, seed=4)
    assert not torch.equal(first[0], c.next_batch()[0])


# a Llama-shaped littlelm model: export writes a stock LlamaForCausalLM whose tensors are ours
LLAMA = dict(
    mlp="swiglu",
    qk_norm=False,
    softcap=None,
    residual_scalars=False,
    value_embeds=False,
    embed_norm=False,
    norm_affine=True,
)


@pytest.mark.parametrize(
    ("seed", "dpo", "shape"),
    [
        (1, {"beta": 0.1, "rpo_alpha": 0}, "llama"),
        (2, {"beta": 0.5, "rpo_alpha": 0}, "llama"),
        (1, {"beta": 0.3, "label_smoothing": 0.2, "rpo_alpha": 0}, "llama"),
        (3, {"beta": 0.1, "rpo_alpha": 0}, "default"),
        (4, {"beta": 0.1, "loss": "ipo", "rpo_alpha": 0}, "llama"),
        (5, {"beta": 0.5, "loss": "ipo", "rpo_alpha": 0}, "default"),
        (6, {"beta": 0.1, "rpo_alpha": 1.0}, "llama"),
        (7, {"beta": 0.2, "rpo_alpha": 0.5}, "default"),
        (8, {"beta": 0.3, "label_smoothing": 0.1, "rpo_alpha": 2.0}, "llama"),
        (9, {"beta": 0.1, "loss": "ipo", "rpo_alpha": 1.0}, "default"),
    ],
)
def test_loss_and_gradients_equal_trls_dpo_trainer(tmp_path, seed, dpo, shape):
    """TRL's DPOTrainer computes its loss (its own _compute_loss: its log-probs, its masks, its
    loss: sigmoid, robust when label_smoothing is set, ipo, and rpo_alpha as TRL 1.x spells it:
    loss_type [..., "sft"] with loss_weights [1, α]) on the transformers export of the same
    policy and reference weights and the same batch of pairs; loss and every gradient agree. On
    the Llama-shaped export (stock LlamaForCausalLM) and on the default model's (littlelm's
    modeling file, loaded with trust_remote_code: TRL runs lm_head on its backbone's
    last_hidden_state itself)."""
    judge("trl")
    from datasets import Dataset
    from test_interop import make_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig as TRLConfig
    from trl import DPOTrainer

    from littlelm.interop.hf import export, remote_tensors, stock_tensors

    data = pref_data(tmp_path, reversal_pairs(40, seed))
    tok, fmt = data.tokenizer, chat_format(data.tokenizer)
    loader = PairLoader(data.pairs.train, "prefs", fmt, 6, 31, seed=seed)
    x, y = loader.next_batch()
    (_, policy), (ref_path, reference) = (
        make_checkpoint(
            tmp_path / name, seed=seed + k, tok=tok, **(LLAMA if shape == "llama" else {})
        )
        for k, name in enumerate(("policy", "reference"))
    )
    policy.train()
    logps, ref = sequence_logps(policy, x, y), sequence_logps(reference, x, y).detach()
    ours = DPOConfig(**dpo)
    loss, _ = dpo_terms(logps, ref, reply_tokens(y), ours)
    loss.backward()
    grads = {n: p.grad for n, p in policy.named_parameters()}
    theirs_grads = (
        stock_tensors(grads, policy.cfg, "llama")
        if shape == "llama"
        else remote_tensors(grads, policy.cfg)
    )

    pol_path = ckpt.latest_checkpoint(tmp_path / "policy" / "checkpoints")
    for name, path in (("hf_policy", pol_path), ("hf_ref", ref_path)):
        export(path, tmp_path / name)
    hf = {
        n: AutoModelForCausalLM.from_pretrained(
            tmp_path / n, dtype=torch.float32, trust_remote_code=shape != "llama"
        )
        for n in ("hf_policy", "hf_ref")
    }
    kind = "robust" if ours.label_smoothing else ours.loss
    args = TRLConfig(
        output_dir=str(tmp_path / "trl"),
        beta=ours.beta,
        loss_type=[kind, "sft"] if ours.rpo_alpha else [kind],
        loss_weights=[1.0, ours.rpo_alpha] if ours.rpo_alpha else None,
        label_smoothing=ours.label_smoothing,
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    rows = [{"prompt": "a", "chosen": "b", "rejected": "c"}] * 2  # TRL wants a dataset; unused
    trainer = DPOTrainer(
        model=hf["hf_policy"],
        ref_model=hf["hf_ref"],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(tmp_path / "hf_policy"),
    )
    # the rows whole (x and their last token: a reply's end, or BOS padding), and TRL's mask of
    # the completion tokens (a token is one when our targets count it)
    last = torch.where(y[:, -1] == IGNORE, tok.bos_id, y[:, -1])
    ids = torch.cat([x, last[:, None]], 1)
    completion = torch.cat([torch.zeros_like(x[:, :1]), (y != IGNORE).long()], 1)
    real = torch.ones_like(ids)  # right padding: causal attention keeps it out of the replies
    inputs = {"input_ids": ids, "attention_mask": real, "completion_mask": completion}
    trainer.model.train()
    theirs = trainer._compute_loss(trainer.model, inputs, False)
    theirs.backward()
    # float32 rounding grows with the figures' size: IPO's loss (Δ - 1/(2β))² is ~25 at β 0.1
    assert abs(loss.item() - theirs.item()) < 1e-5 * max(1, abs(loss.item())), (loss, theirs)
    named = dict(trainer.model.named_parameters())
    compared = 0
    for name, g in theirs_grads.items():
        p = named.get(name)
        assert p is not None, name
        assert (g - p.grad).abs().max().item() < 1e-5 * max(1, g.abs().max().item()), name
        compared += 1
    assert compared == len(named)  # every parameter of theirs has its counterpart here


def dpo_tree(tmp_path: Path, base: Path, model: dict, pairs: Path) -> dict:
    """A DPO run from the run `base` (its tokenizer, its shape) on the pairs of `pairs`."""
    tree = tiny_tree(make_corpus(tmp_path / "corpus.txt"), tmp_path / "runs", run={"name": "dpo"})
    tree["data"] = {
        "tokenizer": {"name": "saved", "path": str(base)},
        "sources": {"prefs": {"name": "preference", "dataset": str(pairs)}},
        "val_fraction": 0.2,
    }
    tree["model"] = model
    tree["sft"] = {"base": str(base)}
    tree["dpo"] = {"beta": 0.5}
    tree["optimizer"] = {"name": "adamw", "lr": 3e-3}
    tree["train"].update(max_steps=6, log_every=1, micro_batch_size=4, seq_len=40)
    tree["eval"] = {"every": 3}
    tree["checkpoint"] = {"every": 3}
    return tree


def records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def first_loss(record: dict, alpha: float) -> float:
    """The loss of a first step (one micro-batch), where the policy is the reference: log 2 and
    α times the chosen replies' NLL per token (summed log-probs over summed tokens)."""
    return np.log(2) - alpha * record["logps_chosen"] / record["tokens_chosen"]


def test_dpo_run_trains_reports_and_resumes_bitwise(tmp_path):
    from test_chat import sft_trees

    base, sft = sft_trees(tmp_path)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", reversal_pairs(80))
    tree = dpo_tree(tmp_path, base, sft["model"], pairs)
    straight = load_run(write_config(tmp_path / "straight.yaml", tree))
    trainer = Trainer(straight, resume="never")
    t = trainer  # the held-out figures before the first step (no record written)
    before = t.objective.validate()  # the base model: the reference itself, so no margin yet
    alpha = straight.dpo.rpo_alpha  # the default's SFT term on the chosen replies
    assert alpha > 0  # the default adds it: its NLL comes on top of log 2
    assert before["val_reward_margin"] == 0 and before["val_loss"] > np.log(2)
    result = trainer.fit()
    assert result["finished"]
    steps = [r for r in records(straight.run_dir()) if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 7))
    for r in steps:
        assert {"reward_margin", "reward_accuracy", "logps_chosen", "logps_rejected"} <= set(r)
        assert r["logps_chosen"] < 0 and r["logps_rejected"] < 0
    # policy = reference at first: DPO's log 2, plus α times the chosen replies' NLL per token
    assert steps[0]["loss"] == pytest.approx(first_loss(steps[0], alpha), abs=1e-5)
    assert steps[0]["reward_accuracy"] == 0.5  # so every pair is a tie, counted half
    evals = [r for r in records(straight.run_dir()) if "val_pairs" in r]
    assert evals and evals[-1]["val_reward_margin"] > 0  # the held-out pairs moved apart
    # interrupted after 3 steps and resumed: the same losses, figures and weights
    tree["run"]["name"] = "split"
    split = load_run(write_config(tmp_path / "split.yaml", tree))
    assert Trainer(split, resume="never").fit(stop_after=3)["step"] == 3
    assert Trainer(split).fit()["finished"]
    keys = ("step", "loss", "tokens", "reward_margin", "logps_chosen", "logps_rejected")
    a = [[r[k] for k in keys] for r in steps]
    b = [[r[k] for k in keys] for r in records(split.run_dir()) if "loss" in r]
    assert a == b
    wa = load_file(ckpt.latest_checkpoint(straight.run_dir() / "checkpoints") / "model.safetensors")
    wb = load_file(ckpt.latest_checkpoint(split.run_dir() / "checkpoints") / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_dpo_on_an_imported_chatml_model(tmp_path):
    """An imported Qwen3 with its own ChatML template: pairs rendered in its format, the last
    reply's tokens counted up to its <|im_end|>, the reference scoring as the policy at first."""
    from test_chat_export import chatml_sft_tree

    (tmp_path / "q").mkdir()
    sft = chatml_sft_tree(tmp_path / "q")
    base = Path(sft["sft"]["base"])
    pairs = write_jsonl(tmp_path / "pairs.jsonl", reversal_pairs(80))
    tree = dpo_tree(tmp_path, base, sft["model"], pairs)
    tree["train"].update(seq_len=64)
    run = load_run(write_config(tmp_path / "dpo.yaml", tree))
    trainer = Trainer(run, resume="never")
    fmt = chat_format(trainer.data.tokenizer)
    assert fmt.template is not None  # the import's ChatML
    _, y = trainer._make_loader(0, 1).next_batch()  # a fresh loader: the run's is untouched
    end = trainer.data.tokenizer.special_id("<|im_end|>")
    assert all(row[row != IGNORE].tolist()[-1] == end for row in y)
    assert trainer.fit()["finished"]
    steps = [r for r in records(run.run_dir()) if "loss" in r]
    # the reference is the base
    assert steps[0]["loss"] == pytest.approx(first_loss(steps[0], run.dpo.rpo_alpha), abs=1e-5)
    assert len(steps) == 6 and all(np.isfinite(r["loss"]) for r in steps)
    assert steps[-1]["reward_margin"] != 0  # the policy moved away from the reference


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sft": None}, "dpo: needs sft: {base: RUN}"),
        ({"dpo": None}, "data.sources.prefs is a preference source, which only a DPO run"),
        (
            {"extra": {"name": "text", "path": "x.txt"}},
            "dpo: needs exactly one data source, a preference source",
        ),
        ({"dpo": {"label_smoothing": 0.5}}, "dpo.label_smoothing"),
        ({"dpo": {"beta": 0}}, "dpo.beta"),
        ({"dpo": {"rpo_alpha": -1}}, "dpo.rpo_alpha"),
        ({"dpo": {"loss": "hinge"}}, "dpo.loss"),
        (
            {"dpo": {"loss": "ipo", "label_smoothing": 0.1}},
            "dpo.label_smoothing is robust DPO's, a form of the sigmoid loss; the ipo loss has none",
        ),
        ({"rl": {"prompts": "prompts.jsonl"}}, "dpo and rl are both set: a run has one objective"),
    ],
)
def test_inconsistent_dpo_configs_are_refused_with_the_fix(tmp_path, change, message):
    tree = dpo_tree(tmp_path, tmp_path / "base", {"name": "gpt", "vocab_size": 300}, tmp_path)
    for key, value in change.items():
        if key == "extra":
            tree["data"]["sources"]["extra"] = value
        else:
            tree[key] = value
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("(", r"\(")):
        load_run(write_config(tmp_path / "bad.yaml", tree))
