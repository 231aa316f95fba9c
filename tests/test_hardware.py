"""`auto` precision: bf16 only where the hardware multiplies bf16 natively (littlelm/hardware.py),
made concrete once per run so checkpoints, MFU and the plan all say what the run computed in."""

from __future__ import annotations

import pytest
import torch

from littlelm import hardware
from littlelm.config import validate
from littlelm.optim.groups import build_optimizer
from littlelm.optim.optimizer import orthogonalize
from littlelm.schema import RunConfig
from littlelm.train.device import autocast, with_precision

pytestmark = pytest.mark.precision  # .ci/run: again with bf16 forced and with fp32


@pytest.fixture
def cpu_flags(monkeypatch):
    """Pretend the CPU reports `flags` (torch.cpu.get_capabilities) for one test, whatever
    LITTLELM_NATIVE_BF16 the suite runs under."""
    monkeypatch.delenv(hardware.OVERRIDE, raising=False)

    def set_flags(**flags):
        hardware.detected_bf16.cache_clear()
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: flags)

    yield set_flags
    hardware.detected_bf16.cache_clear()


def test_x86_without_avx512_bf16_or_amx_is_not_native(cpu_flags):
    cpu_flags(architecture="x86_64", avx2=True, avx512_f=True, avx512_bf16=False, amx_bf16=False)
    assert not hardware.native_bf16("cpu")
    assert hardware.auto_precision("auto", "cpu") == "fp32"


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
def test_x86_with_bf16_units_is_native(cpu_flags, flag):
    cpu_flags(architecture="x86_64", **{flag: True})
    assert hardware.native_bf16("cpu")
    assert hardware.auto_precision("auto", "cpu") == "bf16"


def test_other_architectures_keep_bf16(cpu_flags):
    cpu_flags(architecture="aarch64")
    assert hardware.native_bf16("cpu")


def test_explicit_precision_is_kept(cpu_flags):
    cpu_flags(architecture="x86_64")
    assert hardware.auto_precision("bf16", "cpu") == "bf16"
    assert hardware.auto_precision("fp32", "cpu") == "fp32"


def cfg(**train) -> RunConfig:
    return validate(RunConfig, {"train": {"max_steps": 1, **train}})


def test_default_is_auto_and_resolves_per_device(cpu_flags):
    assert cfg().train.precision == "auto"
    cpu_flags(architecture="x86_64")
    assert with_precision(cfg(), torch.device("cpu")).train.precision == "fp32"
    cpu_flags(architecture="x86_64", avx512_bf16=True)
    assert with_precision(cfg(), torch.device("cpu")).train.precision == "bf16"


def test_bf16_master_weights_compute_in_bf16_anywhere():
    c = cfg(master_weights="bf16")
    assert c.with_precision(native_bf16=False).train.precision == "bf16"
    assert cfg(precision="fp32").with_precision(native_bf16=True).train.precision == "fp32"


def test_autocast_auto_follows_the_hardware(cpu_flags):
    x = torch.randn(4, 4)
    cpu_flags(architecture="x86_64")
    with autocast(torch.device("cpu"), "auto"):
        assert (x @ x).dtype == torch.float32
    cpu_flags(architecture="x86_64", amx_bf16=True)
    with autocast(torch.device("cpu"), "auto"):
        assert (x @ x).dtype == torch.bfloat16


def test_newton_schulz_in_the_dtype_asked_for():
    g = torch.randn(2, 16, 32)
    assert orthogonalize(g).dtype == torch.bfloat16
    fp32 = orthogonalize(g, dtype=torch.float32)
    assert fp32.dtype == torch.float32
    s = torch.linalg.svdvals(fp32)
    assert s.min() > 0.5 and s.max() < 1.3  # the same iteration, orthogonal to within its range


def test_muon_ns_dtype_auto_follows_the_hardware(cpu_flags):
    from littlelm.components import register_all
    from littlelm.train.build import build_model

    register_all()
    tree = {
        "model": {"name": "gpt", "n_layer": 1, "d_model": 32, "n_head": 2, "vocab_size": 64},
        "train": {"max_steps": 1},
    }
    c = validate(RunConfig, tree)
    model = build_model(c, torch.device("cpu"))

    def ns_dtype(**opt):
        optimizer = build_optimizer(model, c.optimizer.model_copy(update=opt))
        return optimizer.rules["muon"].dtype

    cpu_flags(architecture="x86_64")
    assert ns_dtype() == torch.float32
    assert ns_dtype(ns_dtype="bf16") == torch.bfloat16
    cpu_flags(architecture="x86_64", avx512_bf16=True)
    assert ns_dtype() == torch.bfloat16
    assert ns_dtype(ns_dtype="fp32") == torch.float32


def test_eval_and_sample_use_the_trained_precision_where_native(cpu_flags):
    from littlelm.train.device import inference_precision

    cpu = torch.device("cpu")
    cpu_flags(architecture="x86_64")  # bf16 emulated: a bf16-trained model evaluates in fp32
    assert inference_precision("auto", "bf16", cpu) == "fp32"
    assert inference_precision("auto", "auto", cpu) == "fp32"
    assert inference_precision("bf16", "fp32", cpu) == "bf16"  # asked for: done
    cpu_flags(architecture="x86_64", avx512_bf16=True)
    assert inference_precision("auto", "bf16", cpu) == "bf16"
    assert inference_precision("auto", "fp32", cpu) == "fp32"


def test_a_run_says_when_auto_chose_fp32_and_records_it(cpu_flags, tiny_config, capsys):
    from littlelm.console import Console
    from littlelm.schema import load_run
    from littlelm.train.trainer import Trainer

    cpu_flags(architecture="x86_64")  # no native bf16
    result = Trainer(load_run(tiny_config), resume="never", callbacks=(Console(),)).fit(1)
    assert result["step"] == 1
    assert "precision auto -> fp32: this device (cpu) has no native bf16" in capsys.readouterr().out
    import json

    cfg = load_run(tiny_config)
    (state,) = (cfg.run_dir() / "checkpoints").glob("step_*/state.json")
    assert json.loads(state.read_text())["config"]["train"]["precision"] == "fp32"  # not auto


@pytest.mark.parametrize(("value", "native"), [("1", True), ("0", False)])
def test_the_environment_overrides_the_detection(cpu_flags, monkeypatch, value, native):
    cpu_flags(architecture="x86_64", avx512_bf16=not native)  # the detection says the opposite
    monkeypatch.setenv(hardware.OVERRIDE, value)
    assert hardware.native_bf16("cpu") is native
    assert hardware.native_bf16("cuda") is native  # every device: a CI run forces either path
    assert hardware.auto_precision("auto", "cpu") == ("bf16" if native else "fp32")
    assert with_precision(cfg(), torch.device("cpu")).train.precision == (
        "bf16" if native else "fp32"
    )
    monkeypatch.setenv(hardware.OVERRIDE, "")  # empty: unset, the detection decides again
    assert hardware.native_bf16("cpu") is not native


def test_a_bad_override_names_the_values(cpu_flags, monkeypatch):
    from littlelm.errors import LittleLMError

    monkeypatch.setenv(hardware.OVERRIDE, "yes")
    with pytest.raises(LittleLMError, match="LITTLELM_NATIVE_BF16='yes': set it to 1 .* or 0"):
        hardware.native_bf16("cpu")


def test_ci_lints_and_runs_the_precision_tests_both_ways():
    """.ci/run checks ruff's lint and format, and reruns the `precision` tests with `auto`
    forced to bf16 and to fp32, whatever the CI machine's CPU has."""
    from pathlib import Path

    ci = (Path(__file__).parents[1] / ".ci" / "run").read_text()
    assert ".venv/bin/ruff check ." in ci and ".venv/bin/ruff format --check ." in ci
    assert "for native in 1 0; do" in ci
    assert "LITTLELM_NATIVE_BF16=$native" in ci and "-m precision" in ci
