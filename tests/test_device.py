"""Peak FLOP/s for MFU: the CUDA table, the CPU probe and its cache; the CPU allocator tuning."""

from __future__ import annotations

import json
import math
import platform

import pytest
import torch

from littlelm.train import device as dev


def test_cpu_peak_is_probed_once_and_cached(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(dev, "probe_matmul", lambda **_: calls.append(1) or 1.25e12)
    assert dev.cpu_peak_flops(tmp_path) == 1.25e12
    assert dev.cpu_peak_flops(tmp_path) == 1.25e12
    assert len(calls) == 1
    (key,) = json.loads((tmp_path / "cpu_peak.json").read_text())
    assert f"{torch.get_num_threads()}threads" in key and torch.__version__ in key


def test_corrupt_cache_is_probed_again(tmp_path, monkeypatch):
    (tmp_path / "cpu_peak.json").write_text("{not json")
    monkeypatch.setattr(dev, "probe_matmul", lambda **_: 2e11)
    assert dev.cpu_peak_flops(tmp_path) == 2e11
    assert json.loads((tmp_path / "cpu_peak.json").read_text())  # rewritten, readable


def test_probe_measures_a_positive_rate():
    rate = dev.probe_matmul(sizes=(64,), seconds=0.01)
    assert math.isfinite(rate) and rate > 0


def test_probe_leaves_torchs_rng_alone():
    """Only a run's first probe per thread count draws its matrices (2-rank torchrun runs had
    their own key): drawn from torch's RNG they shifted the first run's LoRA dropout masks, so
    two same 2-rank LoRA runs differed (benchmarks/faults.py --lora --nproc 2)."""
    torch.manual_seed(0)
    before = torch.get_rng_state()
    dev.probe_matmul(sizes=(32,), seconds=0.001, dtype=torch.float32)
    assert torch.equal(torch.get_rng_state(), before)


def test_cuda_peak_from_the_table(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H100 PCIe")
    assert dev.peak_flops(cuda) == 756e12  # the PCIe entry, not the SXM one
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    assert dev.peak_flops(cuda) == 989e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Some Future GPU")
    assert math.isnan(dev.peak_flops(cuda))  # MFU is then left out, not made up


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_cpu_allocator_tuning_applies_with_glibc():
    assert dev.tune_cpu_allocator()
    x = torch.empty(64 << 20, dtype=torch.uint8)  # still allocates and frees normally
    del x


def test_cpu_probe_stops_at_the_first_size_that_is_slow(monkeypatch):
    """Without native bf16 one 2048^3 product takes ~17 s: the probe must not reach it when a
    smaller size is already slow (here every size is 'slow' against a tiny time budget)."""
    import littlelm.train.device as device

    seen, real = [], torch.randn
    monkeypatch.setattr(
        device.torch, "randn", lambda *shape, **kw: seen.append(shape) or real(*shape, **kw)
    )
    assert device.probe_matmul(sizes=(32, 2048), seconds=1e-9) > 0
    assert seen == [(32, 32), (32, 32)]  # a and b of the first size only
