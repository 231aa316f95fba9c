from __future__ import annotations

import hashlib
import io
import math
from pathlib import Path

import pytest
import torch

from littlelm.model.gpt import GPT, GPTConfig
from littlelm.optim.groups import (
    AdamWConfig,
    MuonConfig,
    build_optimizer,
    default_origin,
    group_table,
    plan_groups,
)
from littlelm.optim.optimizer import MuonAdamW, orthogonalize
from littlelm.optim.schedule import constant, cosine, momentum_warmup, step_progress, trapezoidal


def model(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(
        GPTConfig(name="gpt", vocab_size=64, n_layer=2, d_model=32, n_head=2, max_seq_len=16, **kw)
    )


def loss_step(m: GPT, opt, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 64, (2, 16), generator=g)
    m(idx, idx).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_adamw_path_equals_torch_adamw():
    cfg = AdamWConfig(name="adamw", lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    ours, ref = model(), model()
    opt = build_optimizer(ours, cfg)
    decay = [p for n, p in ref.named_parameters() if ref.role(n) == "matrix"]
    rest = [p for n, p in ref.named_parameters() if ref.role(n) != "matrix"]
    torch_opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=1e-2,
        betas=(0.9, 0.99),
        eps=1e-8,
        fused=True,  # what littlelm picks on a CPU or CUDA device
    )
    for s in range(5):
        loss_step(ours, opt, s)
        loss_step(ref, torch_opt, s)
    for (n, a), (_, b) in zip(ours.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=n)


@pytest.mark.parametrize("shape", [(64, 256), (256, 64), (128, 128)])
def test_muon_update_is_nearly_orthogonal(shape):
    torch.manual_seed(0)
    s = torch.linalg.svdvals(orthogonalize(torch.randn(*shape)).float())
    bulk = s[
        : int(0.9 * len(s))
    ]  # the largest 90%: tiny singular values of a random square matrix converge last
    assert bulk.min() > 0.6 and s.max() < 1.25, s
    assert abs(s.mean().item() - 1) < 0.2


def muon_group(p: torch.nn.Parameter, **options) -> dict:
    return {"params": [p], "kind": "muon", "lr": 0.1, "weight_decay": 0.0, "ns_steps": 5, **options}


def test_muon_step_moves_by_orthogonal_update():
    p = torch.nn.Parameter(torch.zeros(32, 16))
    opt = MuonAdamW([muon_group(p, momentum=0.0, nesterov=False)])
    assert isinstance(opt, torch.optim.Optimizer)
    p.grad = torch.randn(32, 16)
    opt.step()
    update = -p.detach() / (0.1 * math.sqrt(32 / 16))
    torch.testing.assert_close(update, orthogonalize(p.grad).float(), atol=1e-2, rtol=1e-2)


def test_muon_rejects_non_matrices():
    with pytest.raises(ValueError, match="2-D"):
        MuonAdamW([muon_group(torch.nn.Parameter(torch.zeros(3)), momentum=0.9, nesterov=True)])


def test_groups_route_roles_and_apply_multipliers():
    m = model()
    # as a grown run's tags: every weight old but one matrix; the embeddings keep their tag
    origin = {n: "old" for n, _ in m.named_parameters() if default_origin(m.role(n)) == "new"}
    origin["blocks.1.attn.c_q.weight"] = "new"
    cfg = MuonConfig(
        name="muon", lr=0.03, lr_multipliers={"old": 0.1, "embedding": 0.5}, scale_lr_by_width=False
    )
    groups = {g["name"]: g for g in plan_groups(m, cfg, origin)}
    assert groups["matrix/old"]["kind"] == "muon"
    assert groups["matrix/old"]["lr"] == pytest.approx(0.003)
    assert groups["matrix/new"]["lr"] == pytest.approx(0.03)
    assert len(groups["matrix/new"]["params"]) == 1
    assert groups["embedding/embedding"]["kind"] == "adamw"
    assert groups["embedding/embedding"]["lr"] == pytest.approx(0.2 * 0.5)
    assert groups["lm_head/embedding"]["lr"] == pytest.approx(0.004 * 0.5)
    assert groups["lm_head/embedding"]["role"] == "lm_head"
    assert groups["matrix/old"]["origin"] == "old"
    rows = group_table(list(groups.values()))
    assert sum(r[2] for r in rows) == sum(p.numel() for p in m.parameters())


def test_adamw_lr_scales_with_width():
    m = model()
    groups = {g["name"]: g for g in plan_groups(m, MuonConfig(name="muon"))}
    assert groups["embedding/embedding"]["lr"] == pytest.approx(0.2 * math.sqrt(768 / 32))
    assert groups["matrix/new"]["lr"] == pytest.approx(0.02)


def test_unknown_lr_multiplier_tag():
    with pytest.raises(ValueError, match="unknown tag"):
        MuonConfig(name="muon", lr_multipliers={"older": 0.1})


def test_state_round_trip():
    m = model()
    opt = build_optimizer(m, MuonConfig(name="muon"))
    loss_step(m, opt, 0)
    buffer = io.BytesIO()  # through bytes, as a checkpoint does (state_dict() holds live tensors)
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    m2 = model()
    m2.load_state_dict(m.state_dict())
    opt2 = build_optimizer(m2, MuonConfig(name="muon"))
    opt2.load_state_dict(state)
    loss_step(m, opt, 1)
    loss_step(m2, opt2, 1)
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a, b)


def at(fn, total: int, **options):
    """`fn` over a run of `total` steps, as the trainer calls it."""
    return lambda s: fn(s, step_progress(s, total), **options)


def test_trapezoidal():
    f = at(trapezoidal, 100, warmup_steps=10, cooldown_frac=0.2, floor=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(50) == 1.0 and f(79) == 1.0
    assert f(80) < 1.0 and f(99) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(10, 99))


def test_cosine_and_constant():
    assert at(cosine, 100)(0) == pytest.approx(1.0, abs=1e-3)
    assert at(cosine, 100, floor=0.1)(99) == pytest.approx(0.1)
    assert at(cosine, 100)(49) == pytest.approx(0.5, abs=1e-6)
    assert at(constant, 100, warmup_steps=4)(3) == 1.0
    assert at(constant, 100, warmup_steps=4)(0) == 0.25
    # the warmup's steps are inside the cosine's span (as a budget run, which cannot know
    # where the warmup ends in progress): 10 of 100 warmup steps, step 50 at progress 0.51
    assert at(cosine, 100, warmup_steps=10)(50) == pytest.approx(
        0.5 * (1 + math.cos(0.51 * math.pi))
    )


def old_trapezoidal(step, total, warmup_steps=0, cooldown_frac=0.4, floor=0.0):
    """The step form of 22771fd's optim/schedule.py, for the test below."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    cooldown = max(1, round(cooldown_frac * total)) if cooldown_frac > 0 else 0
    start = total - cooldown
    if step < start or cooldown == 0:
        return 1.0
    return 1.0 + (floor - 1.0) * min(1.0, (step - start + 1) / cooldown)


@pytest.mark.parametrize(
    "total, options",
    [
        (160, dict(warmup_steps=10, cooldown_frac=0.4)),  # the demo as shipped
        (20, dict(warmup_steps=10, cooldown_frac=0.4)),
        (100, dict(warmup_steps=10, cooldown_frac=0.2, floor=0.1)),
        (1000, dict(warmup_steps=100, cooldown_frac=0.3, floor=0.05)),
    ],
)
def test_trapezoidal_keeps_every_multiplier_of_a_cooldown_of_whole_steps(total, options):
    """Progress is exact for a step-bounded run: where cooldown_frac x max_steps is a whole
    number of steps, every multiplier is bit for bit the one of the old step form."""
    new = at(trapezoidal, total, **options)
    assert [new(s) for s in range(total)] == [
        old_trapezoidal(s, total, **options) for s in range(total)
    ]


def test_momentum_warmup():
    assert momentum_warmup(0, 0.85, 0.95, 300) == 0.85
    assert momentum_warmup(150, 0.85, 0.95, 300) == pytest.approx(0.9)
    assert momentum_warmup(1000, 0.85, 0.95, 300) == 0.95


# written by tests/fixtures/old_optimizer.py in a checkout of 22771fd on three kinds of CPU: the
# same code gives other bits on a Xeon with AMX and on an AVX2-only EPYC (BLAS and Newton-Schulz
# take other paths there). Each in the Newton-Schulz dtype its CPU's `auto` chose (bf16 where the
# CPU has bf16 units), which the files do not record: the test tries both, each pinned, so that
# LITTLELM_NATIVE_BF16 does not decide which fixture this CPU can match.
FIXTURES = [
    Path(__file__).parent / "fixtures" / f
    for f in ("optimizer_22771fd.pt", "optimizer_22771fd_amx.pt", "optimizer_22771fd_avx2.pt")
]


def fixture_step(m: GPT, opt, s: int) -> None:
    """As tests/fixtures/old_optimizer.py steps (lr, batch and RNG of step `s`)."""
    idx = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(s))
    torch.manual_seed(100 + s)
    for g in opt.param_groups:
        g["lr"] = g["base_lr"] * (s + 1) / 3
    m(idx, idx).float().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


@pytest.mark.precision
@pytest.mark.parametrize("case", ["muon", "muon_bf16_rounding"])
def test_state_written_by_the_old_optimizer_resumes_bitwise(case):
    """Optimizer state written by the code of 22771fd (one part per inner optimizer) loads, through
    the trainer's resume path, and the next step gives the weights that code gave, bit for bit, on
    the kind of CPU that wrote one of the fixtures (a migration error matches none of them)."""
    matched = [
        (f.name, ns)
        for f in FIXTURES
        for ns in ("bf16", "fp32")
        if old_state_resumes_bitwise(f, case, ns)
    ]
    assert matched, f"the next step matches none of {[f.name for f in FIXTURES]}"


def old_state_resumes_bitwise(fixture: Path, case: str, ns_dtype: str) -> bool:
    from littlelm.train.checkpoint.resume import load_optimizer_state

    saved = torch.load(fixture, weights_only=True)[case]
    assert "optimizers" in saved["optimizer"]  # the old layout
    torch.manual_seed(0)
    m = GPT(
        GPTConfig(
            name="gpt", vocab_size=16, n_layer=1, d_model=32, n_head=2, max_seq_len=8, mlp_hidden=32
        )
    )
    rounding = case.endswith("rounding")
    m = m.to(torch.bfloat16) if rounding else m
    m.load_state_dict(saved["weights"])
    opt = build_optimizer(
        m,
        # scalar_lr: the default of 22771fd (0.002 since 2026-12-05)
        MuonConfig(
            name="muon", weight_decay=0.0 if rounding else 0.1, ns_dtype=ns_dtype, scalar_lr=0.5
        ),
        rounding,
    )
    load_optimizer_state(opt, saved["optimizer"])
    assert {g["kind"] for g in opt.param_groups} == {"muon", "adamw"}
    fixture_step(m, opt, 2)
    assert "optimizers" not in opt.state_dict()  # and it saves torch's layout from now on

    def digest(t):
        return hashlib.sha256(t.detach().contiguous().view(torch.uint8).numpy().tobytes())

    return all(digest(t).hexdigest() == saved["after"][n] for n, t in m.state_dict().items())


def test_old_state_that_does_not_fit_is_refused():
    saved = torch.load(FIXTURES[0], weights_only=True)["muon"]["optimizer"]
    m = model()  # 2 layers: other group sizes
    with pytest.raises(ValueError, match="doesn't match the size|parameter groups"):
        build_optimizer(m, MuonConfig(name="muon")).load_state_dict(saved)
    only_adamw = build_optimizer(model(), AdamWConfig(name="adamw"))
    with pytest.raises(ValueError, match="where this run has|parameter groups"):
        only_adamw.load_state_dict(saved)
