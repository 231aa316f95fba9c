"""Kernel backends (model/kernels.py): which kernels each device gets, the config field, the
start-up summary. The cuda backend's kernels are device-agnostic PyTorch, so they run here."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from littlelm.console import speed_summary
from littlelm.errors import ConfigError
from littlelm.model import kernels as be
from littlelm.model.gpt import GPT, GPTConfig
from littlelm.schema import load_run

SMALL = dict(n_layer=2, d_model=64, n_head=2, vocab_size=256, max_seq_len=64)


def autograd_nodes(loss: torch.Tensor) -> set[str]:
    """Names of every node in loss's backward graph."""
    seen, todo, names = set(), [loss.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(type(fn).__name__)
        todo += [f for f, _ in fn.next_functions]
    return names


def test_auto_picks_the_device_backend():
    assert be.select_backend("auto", torch.device("cpu")) is be.CPU
    assert be.select_backend("auto", "cuda:1") is be.CUDA  # naming a device needs no GPU
    assert be.select_backend("auto", "mps").name == "cpu"  # elsewhere: today's kernels
    assert be.select_backend("cuda", "cpu") is be.CUDA  # forced, e.g. to test it here
    assert be.select_backend("cpu", "cuda") is be.CPU


def test_cuda_backend_uses_pytorch_kernels_and_cpu_keeps_its_own():
    assert be.CUDA.attention is be.sdpa_causal and be.CUDA.rms_norm is be.torch_rms_norm
    assert be.CPU.loss == "chunked"
    torch.manual_seed(0)
    x = torch.randint(0, 256, (2, 40))
    nodes = {}
    for name in ("cpu", "cuda"):
        model = GPT(GPTConfig(**SMALL, backend=name))
        nodes[name] = autograd_nodes(model(x, x))
    hand_written = {"_RMSNormBackward", "_BlockedCausalAttentionBackward", "_ReLUSquaredBackward"}
    hand_written |= {"_ResidualMixBackward", "_GatedAddBackward", "_RoPEBackward"}
    assert hand_written <= nodes["cpu"]
    assert not hand_written & nodes["cuda"]  # PyTorch autograd all the way down
    assert any("ScaledDotProduct" in n for n in nodes["cuda"])


def test_cuda_loss_is_liger_when_installed(monkeypatch):
    monkeypatch.setattr(be, "has_liger", lambda: True)
    assert be.cuda_backend().loss == "liger"
    monkeypatch.setattr(be, "has_liger", lambda: False)
    assert be.cuda_backend().loss == "chunked"  # never the full logits without Liger
    assert be.loss_impl("auto", be.CPU) == "chunked"
    assert be.loss_impl("plain", be.CUDA) == "plain"  # an explicit choice wins


def test_compile_is_the_train_sections_choice(tiny_config):
    """train.compile: null compiles on CUDA only, whatever kernel backend the model uses."""
    auto = load_run(tiny_config).train
    assert auto.compiles("cuda") and not auto.compiles("cpu")
    forced = load_run(tiny_config, ["model.backend=cpu"]).train
    assert forced.compiles(torch.device("cuda"))
    assert load_run(tiny_config, ["train.compile=true"]).train.compiles("cpu")
    assert not load_run(tiny_config, ["train.compile=false"]).train.compiles("cuda")


def test_both_backends_compute_the_same_function():
    """fp32 on the CPU: loss and every gradient agree to rounding."""
    torch.manual_seed(0)
    cpu = GPT(GPTConfig(**SMALL, backend="cpu"))
    for p in cpu.parameters():  # away from the zero init, so every gradient is non-trivial
        torch.nn.init.normal_(p, std=0.05)
    cuda = GPT(GPTConfig(**SMALL, backend="cuda"))
    cuda.load_state_dict(cpu.state_dict())
    x = torch.randint(0, 256, (2, 48))
    grads = []
    for model in (cpu, cuda):
        loss = model(x, x)
        loss.backward()
        grads.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (la, ga), (lb, gb) = grads
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-6)
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-4, atol=1e-6, msg=n)


def test_backend_validates_and_shows_in_the_summary(tiny_config):
    with pytest.raises(ConfigError, match="model.backend"):
        load_run(tiny_config, ["model.backend=gpu"])
    cfg = load_run(tiny_config)
    assert (cfg.model.backend, cfg.model.loss, cfg.train.compile) == ("auto", "auto", None)
    on_cpu = speed_summary(cfg, torch.device("cpu"))
    assert on_cpu.startswith("cpu backend (blocked attention") and "chunked loss" in on_cpu
    assert "torch.compile" not in on_cpu
    on_cuda = speed_summary(cfg, torch.device("cuda"))
    assert (
        on_cuda.startswith("cuda backend (SDPA attention, F.rms_norm")
        and "torch.compile" in on_cuda
    )
    forced = load_run(tiny_config, ["model.backend=cpu", "train.compile=false"])
    assert "cpu backend" in speed_summary(forced, "cuda") and "compile" not in speed_summary(
        forced, "cuda"
    )


def test_the_model_picks_its_kernels_when_placed_not_at_each_forward(monkeypatch):
    """GPT.use_kernels: at construction, and again after every move of the parameters."""
    model = GPT(GPTConfig(**SMALL))
    assert model.kernels is be.CPU and model.loss_impl == "chunked"
    standin = dataclasses.replace(be.CPU, name="standin", loss="plain")
    monkeypatch.setitem(be.BACKENDS, "cpu", standin)
    x = torch.randint(0, 256, (1, 8))
    model(x, x)
    assert model.kernels is be.CPU  # a forward picks nothing
    model.to(torch.float32)  # a move (.to, .cuda, to_empty) picks for the parameters' device
    assert model.kernels is standin and model.loss_impl == "plain"
