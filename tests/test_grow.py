"""Growth: the grown model computes the parent's function, tags its parameters, and trains."""

from __future__ import annotations

import itertools
import json
import shutil

import pytest
import torch
import yaml

from conftest import make_corpus, tiny_tree, write_config
from littlelm.cli import main
from littlelm.errors import CheckpointError, ConfigError, TrainingError
from littlelm.load import load_model
from littlelm.model.gpt import GPT, GPTConfig, flops_per_token
from littlelm.model.grow import (
    check_growable,
    grow_into,
    grown_value_embed_layers,
    layer_map,
    logit_gap,
)
from littlelm.optim.groups import MuonConfig, origin_tags, plan_groups
from littlelm.optim.schedule import DEFAULT_LR_MULTIPLIERS, OriginRamp, origin_multipliers
from littlelm.schema import load_run, resumable
from littlelm.train.callbacks import Callback
from littlelm.train.checkpoint import files as ckpt
from littlelm.train.growth import complete_growth
from littlelm.train.trainer import Trainer

# ----------------------------------------------------------------------------------------------
# The function is preserved


def gpt_cfg(**kw) -> GPTConfig:
    base = {"name": "gpt", "vocab_size": 70, "n_layer": 3, "d_model": 32, "n_head": 2}
    return GPTConfig(**{**base, "max_seq_len": 16, **kw})


def trained_like(cfg: GPTConfig) -> GPT:
    """A model whose every parameter is non-trivial: a fresh one has zero output projections and
    gates, which would hide any mistake in how blocks or their outputs are carried over."""
    torch.manual_seed(0)
    m = GPT(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.5))
            if "resid_lambdas" in name or "norm" in name:
                p.add_(1.0)
    return m


def grow(parent: GPT, placement="interleave", widened="old", **child_kw) -> GPT:
    return grow_tagged(parent, placement, widened, **child_kw)[0]


def grow_tagged(parent: GPT, placement="interleave", widened="old", **child_kw):
    """(the grown child, its origin tags)."""
    pc = parent.cfg
    cc = gpt_cfg(
        **{k: getattr(pc, k) for k in ("tie_embeddings", "mlp", "norm_affine")}, **child_kw
    )
    layers = layer_map(placement, pc.n_layer, cc.n_layer)
    cc = cc.model_copy(update={"value_embed_layers": grown_value_embed_layers(pc, cc, layers)})
    assert check_growable(pc, cc, layers) == []
    torch.manual_seed(1)
    child = GPT(cc)
    return child, grow_into(child, parent.state_dict(), pc, layers, widened)


GROWTHS = {
    "depth, interleave": ({}, "interleave", {"n_layer": 5}),
    "depth, end": ({}, "end", {"n_layer": 5}),
    "depth, start": ({}, "start", {"n_layer": 4}),
    "depth, explicit": ({}, [None, 0, 1, None, 2, None], {"n_layer": 6}),
    "mlp width": ({}, "end", {"mlp_hidden": 192}),
    "heads (head_size kept)": ({}, "end", {"n_head": 4, "head_size": 16}),
    "kv heads, new group size": (
        {"n_head": 2, "n_kv_head": 1},
        "end",
        {"n_head": 6, "n_kv_head": 2, "head_size": 16},
    ),
    "d_model and heads": ({}, "end", {"d_model": 64, "n_head": 4}),
    "d_model, tied embeddings": ({"tie_embeddings": True}, "end", {"d_model": 64, "n_head": 4}),
    "everything, swiglu + norm gains": (
        {"mlp": "swiglu", "norm_affine": True},
        "interleave",
        {"n_layer": 5, "d_model": 48, "n_head": 3, "mlp_hidden": 256},
    ),
}


@pytest.mark.parametrize("case", list(GROWTHS))
def test_grown_model_has_the_parents_logits(case):
    parent_kw, placement, child_kw = GROWTHS[case]
    parent = trained_like(gpt_cfg(**parent_kw))
    child = grow(parent, placement, **child_kw)
    tokens = torch.randint(0, 70, (2, 16), generator=torch.Generator().manual_seed(2))
    gap, largest = logit_gap(parent, child, tokens)
    assert largest > 1.0  # the parent computes something non-trivial
    assert gap <= 1e-5 * largest, f"{case}: max |Δlogit| {gap}"


def test_a_grown_model_grows_again():
    """2B -> 3B after 1B -> 2B: the second growth reads the first one's value-embedding list."""
    first = trained_like(gpt_cfg(n_layer=2))
    second = grow(first, "interleave", n_layer=3, d_model=48, n_head=3)
    with torch.no_grad():  # train it a little: no parameter keeps its grown value
        for p in second.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(4)))
    third = grow(second, "start", n_layer=5, d_model=48, n_head=3, mlp_hidden=256)
    tokens = torch.randint(0, 70, (2, 16), generator=torch.Generator().manual_seed(2))
    gap, largest = logit_gap(second, third, tokens)
    assert gap <= 1e-5 * largest


def test_new_parts_get_gradients():
    """Zero-initialised parts must still learn: new blocks' outputs, new stream channels."""
    parent = trained_like(gpt_cfg())
    child = grow(parent, "end", n_layer=4, d_model=64, n_head=4)
    idx = torch.randint(0, 70, (2, 16), generator=torch.Generator().manual_seed(3))
    child(idx, idx).backward()
    assert child.blocks[3].attn.c_proj.weight.grad.abs().sum() > 0  # a new block
    assert child.blocks[0].mlp.c_proj.weight.grad[32:].abs().sum() > 0  # new stream channels
    assert child.wte.weight.grad[:, 32:].abs().sum() > 0


def test_placements():
    assert layer_map("interleave", 4, 6) == [0, 1, None, 2, 3, None]
    assert layer_map("interleave", 2, 6) == [0, None, None, 1, None, None]
    assert layer_map("end", 2, 3) == [0, 1, None]
    assert layer_map("start", 2, 3) == [None, 0, 1]
    with pytest.raises(ValueError, match="each parent block"):
        layer_map([1, 0, None], 2, 3)
    with pytest.raises(ValueError, match="cannot remove blocks"):
        layer_map("end", 3, 2)


def test_value_embeddings_move_with_their_blocks():
    parent = gpt_cfg(n_layer=4)  # tables on layers 1 and 3
    child = gpt_cfg(n_layer=5)
    layers = layer_map("interleave", 4, 5)  # [0, 1, 2, 3, None]
    assert grown_value_embed_layers(parent, child, layers) == [1, 3, 4]
    wrong = child.model_copy(update={"value_embed_layers": [0, 2, 4]})
    assert "must include [1, 3]" in "".join(check_growable(parent, wrong, layers))


def test_unpreservable_changes_are_refused_with_the_fix():
    parent, layers = gpt_cfg(), [0, 1, 2]
    problems = check_growable(parent, gpt_cfg(n_head=4), layers)  # head_dim 16 -> 8
    assert any("set model.head_size: 16" in p for p in problems)
    assert any("cannot shrink" in p for p in check_growable(parent, gpt_cfg(d_model=16), layers))
    assert any("model.mlp" in p for p in check_growable(parent, gpt_cfg(mlp="swiglu"), layers))


def test_origin_tags_and_lr_multipliers():
    parent = trained_like(gpt_cfg(n_layer=2))
    child, o = grow_tagged(parent, "end", n_layer=3, mlp_hidden=192)
    assert o["blocks.0.attn.c_q.weight"] == "old"  # copied whole
    assert o["blocks.0.mlp.c_fc.weight"] == "old"  # widened: GrowConfig.widened
    assert o["blocks.2.attn.c_q.weight"] == "new"
    assert o["value_embeds.2.weight"] == "new" and o["value_embeds.1.weight"] == "embedding"
    assert o["wte.weight"] == o["lm_head.weight"] == "embedding"
    assert o["resid_lambdas"] == "old"
    assert grow_tagged(parent, "end", "new", n_layer=3)[1]["resid_lambdas"] == "new"
    cfg = MuonConfig(
        name="muon",
        lr=0.02,
        lr_multipliers={"old": 0.05, "embedding": 0.5},
        scale_lr_by_width=False,
    )
    lrs = {g["name"]: (g["kind"], g["lr"]) for g in plan_groups(child, cfg, o)}
    assert lrs["matrix/old"] == ("muon", pytest.approx(0.001))
    assert lrs["matrix/new"] == ("muon", pytest.approx(0.02))
    assert lrs["embedding/embedding"] == ("adamw", pytest.approx(0.1))


def test_flops_count_follows_head_size():
    cfg = gpt_cfg(n_head=4, head_size=16)  # attention inner width 64 on a 32-wide stream
    m = GPT(cfg)
    weights = sum(p.numel() for n, p in m.named_parameters() if m.role(n) in ("matrix", "lm_head"))
    attention = 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * 16
    assert flops_per_token(cfg, 16) == 6 * weights + attention


def test_model_config_checks_value_embed_layers():
    with pytest.raises(ValueError, match="value_embed_layers"):
        gpt_cfg(value_embed_layers=[0, 3])
    assert gpt_cfg(value_embed_layers=[0]).has_value_embed(0)
    assert not gpt_cfg(value_embed_layers=[0]).has_value_embed(2)


# ----------------------------------------------------------------------------------------------
# Runs: the grow section, the trainer, resume, the CLI


@pytest.fixture(scope="module")
def parent_run(tmp_path_factory):
    """A tiny trained parent run (fp32, its own data cache)."""
    root = tmp_path_factory.mktemp("grow")
    corpus = make_corpus(root / "corpus.txt")
    tree = parent_tree(corpus, root)
    Trainer(load_run(write_config(root / "parent.yaml", tree)), resume="never").fit()
    return root, corpus


def parent_tree(corpus, root) -> dict:
    tree = tiny_tree(
        corpus, root / "runs", run={"name": "parent"}, train={"precision": "fp32", "max_steps": 4}
    )
    tree["data"]["cache_dir"] = str(root / "cache")
    tree["checkpoint"]["every"] = 0
    return tree


def grown_config(root, corpus, name: str, tmp_path, **grow):
    tree = parent_tree(corpus, root)
    tree["run"]["name"] = name
    tree["run"]["out_dir"] = str(tmp_path / "runs")
    tree["model"].update(n_layer=3, d_model=48, n_head=3)
    tree["optimizer"]["lr_multipliers"] = {"old": 0.033, "embedding": 0.17}
    tree["grow"] = {"parent": str(root / "runs" / "parent"), **grow}
    return write_config(tmp_path / f"{name}.yaml", tree)


def train_losses(run_dir) -> list[tuple[int, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines) if r["kind"] == "train"]


def test_grown_run_records_parent_trains_and_resumes(parent_run, tmp_path):
    root, corpus = parent_run
    parent_ckpt = root / "runs" / "parent" / "checkpoints" / "step_000004"
    run_file = grown_config(root, corpus, "straight", tmp_path)
    pure = load_run(run_file)  # loading a config reads no checkpoint: nothing derived yet
    assert pure.grow.placement == "interleave" and pure.model.value_embed_layers is None
    cfg = complete_growth(pure)  # at start-up, from the parent's state.json
    assert cfg.grow.parent == str(parent_ckpt)  # the run directory resolved to its checkpoint
    assert cfg.grow.placement == [0, 1, None] and cfg.model.value_embed_layers == [1, 2]
    t = Trainer(cfg, resume="never")
    assert {g["name"] for g in t.optimizer.param_groups} >= {"matrix/old", "matrix/new"}
    parent_loader = json.loads((parent_ckpt / "state.json").read_text())["loader"]
    assert t.state.loader.state_dict() == parent_loader  # continues the parent's data
    t.fit()
    recorded = yaml.safe_load((cfg.run_dir() / "config.yaml").read_text())
    assert recorded["grow"]["parent"] == str(parent_ckpt)

    split_cfg = grown_config(root, corpus, "split", tmp_path)
    Trainer(load_run(split_cfg), resume="never").fit(stop_after=2)
    # resuming needs neither the run file's derivations nor the parent: its resolved config
    resolved = tmp_path / "runs" / "split" / "config.yaml"
    shutil.move(root / "runs" / "parent", root / "parent_away")
    try:
        Trainer(load_run(resolved)).fit()
    finally:
        shutil.move(root / "parent_away", root / "runs" / "parent")
    assert train_losses(tmp_path / "runs" / "split") == train_losses(cfg.run_dir())
    # growth records where it started, so a report continues the parent's axes; the start
    # record of the session resumed without the parent keeps the first one's
    from littlelm.report.runs import load_run_dir

    parent_state = json.loads((parent_ckpt / "state.json").read_text())
    for run_dir in (cfg.run_dir(), tmp_path / "runs" / "split"):
        assert load_run_dir(run_dir).grown_start() == {
            "checkpoint": str(parent_ckpt),
            "step": 4,
            "tokens": parent_state["tokens"],
        }


def test_grow_errors_name_the_fix(parent_run, tmp_path):
    root, corpus = parent_run
    missing = grown_config(root, corpus, "a", tmp_path)
    nowhere = load_run(missing, [f"grow.parent={tmp_path / 'nowhere'}"])  # loads: no I/O
    with pytest.raises(ConfigError, match="grow.parent: no complete checkpoint"):
        complete_growth(nowhere)
    with pytest.raises(ConfigError, match="grow.parent: no complete checkpoint"):
        Trainer(nowhere, resume="never")  # the trainer looks the parent up at start-up
    assert not nowhere.run_dir().exists()  # before any work
    with pytest.raises(ConfigError, match="cannot remove blocks"):
        complete_growth(load_run(grown_config(root, corpus, "b", tmp_path), ["model.n_layer=1"]))
    with pytest.raises(ConfigError, match=r"run\.seed.*grow.continue_data: false"):
        Trainer(load_run(grown_config(root, corpus, "c", tmp_path), ["run.seed=5"]))
    fine = load_run(grown_config(root, corpus, "d", tmp_path, continue_data=False), ["run.seed=5"])
    assert Trainer(fine, resume="never").step == 0
    broken = tmp_path / "broken_parent"
    broken.mkdir()
    (broken / "state.json").write_text("{not json")
    with pytest.raises(ConfigError, match="grow.parent: cannot read"):
        complete_growth(
            load_run(grown_config(root, corpus, "h", tmp_path), [f"grow.parent={broken}"])
        )


def test_grow_refuses_other_tokenizer(parent_run, tmp_path):
    root, corpus = parent_run
    src = root / "runs" / "parent" / "checkpoints" / "step_000004"
    other = tmp_path / "other_parent"
    shutil.copytree(src, other)
    state = json.loads((other / "state.json").read_text())
    state["tokenizer"] = "something else"
    (other / "state.json").write_text(json.dumps(state))
    cfg = load_run(grown_config(root, corpus, "e", tmp_path), [f"grow.parent={other}"])
    with pytest.raises(CheckpointError, match="different tokenizer"):
        Trainer(cfg, resume="never")


def test_logit_check_catches_a_broken_growth(parent_run, tmp_path, monkeypatch):
    import littlelm.train.growth as growth

    def broken(child, tensors, *args):
        origin = grow_into(child, tensors, *args)
        with torch.no_grad():
            child.lm_head.weight.mul_(1.05)  # logits 5% off
        return origin

    monkeypatch.setattr(growth, "grow_into", broken)
    root, corpus = parent_run
    cfg = load_run(grown_config(root, corpus, "f", tmp_path))
    with pytest.raises(TrainingError, match="does not reproduce"):
        Trainer(cfg, resume="never")


def test_cli_grow_checks_and_reports(parent_run, tmp_path, capsys):
    root, corpus = parent_run
    run = grown_config(root, corpus, "g", tmp_path)
    parent = str(root / "runs" / "parent")
    assert main(["grow", parent, "--to", str(run)]) == 0
    out = capsys.readouterr().out
    assert "layer <- parent block: 0 1 new" in out and "matrix/old" in out
    assert "max |Δlogit|" in out and f"littlelm train {run}" in out
    assert not (tmp_path / "runs" / "g").exists()  # writes nothing
    assert main(["grow", parent, "--to", str(run), "model.n_head=6"]) == 2
    assert "head_size" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# Per-origin lr schedules (grow.lr_multipliers)


def test_ramp_shapes():
    geo = OriginRamp(start=0.01, end=1.0, ramp_steps=4)
    values = [geo.at(s) for s in range(7)]
    assert values[0] == 0.01 and values[4:] == [1.0, 1.0, 1.0]
    ratios = [b / a for a, b in itertools.pairwise(values[:5])]
    assert ratios == pytest.approx([100**0.25] * 4)  # the same factor every step
    lin = OriginRamp(start=0.2, end=1.0, ramp_steps=4, shape="linear")
    assert [lin.at(s) for s in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert OriginRamp(start=0.1, end=0.5, ramp_steps=0).at(0) == 0.5
    assert origin_multipliers({"old": geo, "embedding": 0.5}, 2) == {
        "old": pytest.approx(0.1),
        "embedding": 0.5,
    }


def test_lr_multipliers_resolve(parent_run, tmp_path, monkeypatch):
    import littlelm.optim.schedule as schedule

    root, corpus = parent_run
    run = grown_config(root, corpus, "r", tmp_path)  # sets optimizer.lr_multipliers
    assert load_run(run).grow.lr_multipliers == {}  # as before grow.lr_multipliers existed
    default = load_run(run, ["optimizer.lr_multipliers={}"]).grow.lr_multipliers
    assert default == DEFAULT_LR_MULTIPLIERS  # none measured yet: one lr (docs/growth.md)
    measured = {"old": OriginRamp(start=0.1, ramp_steps=5)}
    monkeypatch.setattr(schedule, "DEFAULT_LR_MULTIPLIERS", measured)
    assert load_run(run, ["optimizer.lr_multipliers={}"]).grow.lr_multipliers == measured
    assert load_run(run).grow.lr_multipliers == {}  # optimizer.lr_multipliers win
    ramp = "grow.lr_multipliers={old: {start: 0.1, ramp_steps: 3}, new: 2}"
    cfg = load_run(run, ["optimizer.lr_multipliers={}", ramp])
    assert cfg.grow.lr_multipliers == {"old": OriginRamp(start=0.1, ramp_steps=3), "new": 2.0}
    with pytest.raises(ConfigError, match="lr_multipliers.old would multiply"):
        load_run(run, [ramp])
    with pytest.raises(ConfigError, match="unknown tag 'older'"):
        load_run(run, ["grow.lr_multipliers={older: 0.1}"])
    with pytest.raises(ConfigError, match="ramp_steps"):
        load_run(run, ["optimizer.lr_multipliers={}", "grow.lr_multipliers={old: {start: 0.1}}"])
    # a learning-rate setting: a resumed run may change it; the parent may not change
    tree = yaml.safe_load((tmp_path / "r.yaml").read_text())
    assert resumable("grow.lr_multipliers.old.start", tree)
    assert not resumable("grow.parent", tree) and not resumable("grow.placement", tree)


class LrRecorder(Callback):
    """Each step's learning rate per group, as the optimizer used it."""

    def __init__(self):
        self.lrs: dict[int, dict[str, float]] = {}

    def on_step_end(self, trainer, metrics):
        self.lrs[metrics["step"] - 1] = {g["name"]: g["lr"] for g in trainer.optimizer.param_groups}


def test_ramp_sets_each_steps_lrs_and_resumes_bitwise(parent_run, tmp_path):
    root, corpus = parent_run
    ramp = "grow.lr_multipliers={old: {start: 0.05, ramp_steps: 4}, embedding: 0.5}"
    overrides = ["optimizer.lr_multipliers={}", ramp, "checkpoint.every=0", "train.max_steps=6"]
    cfg = load_run(grown_config(root, corpus, "ramped", tmp_path), overrides)
    t = Trainer(cfg, resume="never")
    straight = LrRecorder()
    t.callbacks.append(straight)
    t.fit()
    base = {g["name"]: g["base_lr"] for g in t.optimizer.param_groups}
    old = OriginRamp(start=0.05, ramp_steps=4)
    for step, lrs in straight.lrs.items():  # 6 steps: inside the ramp, then after it
        sched = t.schedule.lr(step, t.state.budget.progress(step))
        assert lrs["matrix/new"] == base["matrix/new"] * sched
        assert lrs["matrix/old"] == pytest.approx(base["matrix/old"] * sched * old.at(step))
        assert lrs["embedding/embedding"] == pytest.approx(base["embedding/embedding"] * sched / 2)
    assert straight.lrs[5]["matrix/old"] == straight.lrs[5]["matrix/new"]  # the ramp is done

    split_cfg = load_run(grown_config(root, corpus, "ramped_split", tmp_path), overrides)
    Trainer(split_cfg, resume="never").fit(stop_after=2)  # stopped inside the ramp
    resumed = Trainer(load_run(tmp_path / "runs" / "ramped_split" / "config.yaml"))
    assert resumed.step == 2
    after = LrRecorder()
    resumed.callbacks.append(after)
    resumed.fit()
    assert after.lrs == {s: straight.lrs[s] for s in range(2, 6)}
    assert train_losses(tmp_path / "runs" / "ramped_split") == train_losses(cfg.run_dir())
    for a, b in zip(t.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)


def test_start_table_and_cli_show_the_ramp(parent_run, tmp_path, capsys):
    root, corpus = parent_run
    run = grown_config(root, corpus, "shown", tmp_path)
    parent = str(root / "runs" / "parent")
    ramp = "grow.lr_multipliers={old: {start: 0.033, ramp_steps: 200}}"
    assert main(["grow", parent, "--to", str(run), "optimizer.lr_multipliers={}", ramp]) == 0
    out = capsys.readouterr().out
    assert "in 200 steps" in out and "one lr for old and new" not in out
    row = next(line for line in out.splitlines() if line.startswith("matrix/old"))
    assert "0.00066 → 0.02 in 200 steps" in row  # Muon's 0.02 × 0.033, ramped to 0.02
    one_lr = ["optimizer.lr_multipliers={}", "grow.lr_multipliers={}"]
    assert main(["grow", parent, "--to", str(run), *one_lr]) == 0
    advice = capsys.readouterr().out
    assert "one lr for old and new weights" in advice
    assert "To learn new data and keep the old, set grow.lr_multipliers: {old: 0.2" in advice


# ----------------------------------------------------------------------------------------------
# Several stages: A -> B -> C, each trained between


def test_three_stage_growth_keeps_function_and_tags(parent_run, tmp_path):
    """A (2 layers × 32) -> B (3 × 48) -> C (5 × 48, MLP wider): at step 0 of B and of C the
    model computes its parent's trained function, and what was new in B is old in C."""
    root, corpus = parent_run
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(5))

    def stage(name: str, parent_dir, **model) -> Trainer:
        tree = yaml.safe_load(grown_config(root, corpus, name, tmp_path).read_text())
        tree["model"].update(model)
        tree["grow"]["parent"] = str(parent_dir)
        tree["train"]["max_steps"] = 2
        t = Trainer(load_run(write_config(tmp_path / f"{name}.yaml", tree)), resume="never")
        parent, _, _ = load_model(parent_dir)
        gap, largest = logit_gap(parent, t.model, tokens)
        assert gap <= 1e-5 * largest, f"{name}: max |Δlogit| {gap} (largest {largest})"
        t.fit()
        moved, _ = logit_gap(parent, t.model, tokens)  # training changed the function
        assert moved > 1e-3 * largest, f"{name}: {moved}"
        return t

    b = stage("stage_b", root / "runs" / "parent", n_layer=3, d_model=48, n_head=3)
    tags = origin_tags(b.model, b.optimizer)  # the optimizer's groups hold growth's tags
    assert tags["blocks.2.attn.c_q.weight"] == "new"
    assert tags["blocks.0.attn.c_q.weight"] == "old"
    c = stage("stage_c", b.run_dir, n_layer=5, d_model=48, n_head=3, mlp_hidden=256)
    assert c.cfg.grow.placement == [0, 1, None, 2, None]
    o = origin_tags(c.model, c.optimizer)
    assert o["blocks.3.attn.c_q.weight"] == "old"  # B's new block 2, trained in B: old now
    assert o["blocks.3.attn.c_proj.weight"] == "old"
    assert o["blocks.2.attn.c_q.weight"] == o["blocks.4.mlp.c_fc.weight"] == "new"
    assert o["blocks.0.mlp.c_fc.weight"] == "old"  # widened: grow.widened
    assert o["wte.weight"] == "embedding"
    assert {g["name"] for g in c.optimizer.param_groups} >= {"matrix/old", "matrix/new"}
    saved = ckpt.load_checkpoint(ckpt.latest_checkpoint(c.run_dir / "checkpoints")).origin
    # the tags C's checkpoint keeps
    assert saved == o


def test_sft_with_bf16_master_weights_starts_and_the_check_names_sfts_key(tmp_path, monkeypatch):
    """train.master_weights=bf16 from an fp32 base: the copy holds the base rounded to bf16, and
    is compared with the base rounded the same way (not called a bug); a failing check names
    the key the run set, sft.verify_tokens."""
    from test_chat import sft_trees

    from littlelm.train import growth

    _, tree = sft_trees(tmp_path)
    tree["train"]["master_weights"] = "bf16"
    cfg = load_run(write_config(tmp_path / "sft.yaml", tree))
    trainer = Trainer(cfg, resume="never")
    assert trainer.model.wte.weight.dtype == torch.bfloat16
    monkeypatch.setattr(growth, "VERIFY_RTOL_LOW", -1.0)  # any gap fails: the message's words
    with pytest.raises(TrainingError, match=r"in bfloat16\. .*\(sft\.verify_tokens: 0 skips"):
        Trainer(cfg, resume="never")
