import pytest

from littlelm.errors import ConfigError
from littlelm.registry import Registry


def test_register_get_and_unknown_name_lists_known():
    reg = Registry("widget-test")

    @reg.register("round")
    class Round:
        """A round widget."""

    assert reg.get("round") is Round
    assert reg.entry("round").doc == "A round widget."
    with pytest.raises(
        ConfigError, match=r"unknown widget-test 'rund' \(did you mean 'round'\?\); known: round"
    ):
        reg.get("rund")


def test_every_kind_of_component_is_registered():
    for kind in ("model", "optimizer", "schedule", "tokenizer", "dataset", "callback"):
        assert Registry.all[kind].names(), kind
