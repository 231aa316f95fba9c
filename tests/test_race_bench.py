"""benchmarks/race_nanochat.py's own arithmetic: nanochat's schedules are read out of its
base_train.py (a script that cannot be imported) and run with its defaults, and littlelm's time to
reach nanochat's loss is interpolated between the budgets run, never guessed beyond them."""

import math
from pathlib import Path

import pytest

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def race():
    module = load_benchmark("race_nanochat.py")
    return module


def test_schedules_come_from_the_checkouts_script_with_its_defaults(race, tmp_path):
    # a stand-in base_train.py: top-level code that must not run, the three functions that must
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "base_train.py").write_text(
        "raise SystemExit('the script ran')\n"
        "def get_lr_multiplier(it):\n    return (args.warmup_steps, args.final_lr_frac, it)\n"
        "def get_muon_momentum(it):\n    return num_iterations\n"
        "def get_weight_decay(it):\n    return weight_decay_scaled * math.cos(0)\n"
    )
    lr, momentum, wd = race.nanochat_schedules(tmp_path, 480)
    assert lr(3) == (40, 0.05, 3)
    assert momentum(0) == 480
    assert wd(0) == 0.0


def test_a_checkout_without_the_schedules_is_refused_naming_the_commit(race, tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "base_train.py").write_text("def get_lr_multiplier(it):\n    pass\n")
    with pytest.raises(SystemExit, match=race.PINNED):
        race.nanochat_schedules(tmp_path, 10)


def test_time_to_a_loss_interpolates_in_log_time_and_never_extrapolates(race):
    pts = [(10.0, 2.0), (40.0, 1.5)]
    assert race.time_to(pts, 1.75) == pytest.approx(math.sqrt(10 * 40))
    assert race.time_to(pts, 2.5) == 10.0  # reached by the first budget: its time, an upper bound
    assert race.time_to(pts, 1.4) is None  # no budget reached it: '>' in the table


def test_fixed_rows_take_every_row_once_a_pass_in_a_new_order_each_pass(race):
    n = 130 * race.SEQ + 5  # rows start at 0, SEQ, ..., 129·SEQ
    per_pass = len(range(0, n - race.SEQ - 1, race.SEQ))
    assert per_pass == 130
    steps = -(-2 * per_pass // race.BATCH)  # batches enough for two passes
    got = [int(i) for ix in race.window_starts(n, steps, 0, rows=True) for i in ix]
    first, second = got[:per_pass], got[per_pass : 2 * per_pass]
    assert sorted(first) == list(range(0, n - race.SEQ - 1, race.SEQ)) == sorted(second)
    assert first != second  # shuffled anew
    windows = [int(i) for ix in race.window_starts(n, 4, 0, rows=False) for i in ix]
    assert all(0 <= i < n - race.SEQ - 1 for i in windows) and any(i % race.SEQ for i in windows)


def test_every_variant_is_a_valid_change_of_the_shipped_config(race, monkeypatch):
    # the ablations run as command-line overrides of configs/shakespeare_char.yaml: a variant
    # the config refuses (an unknown key, `cut: anywhere` without max_chars) would fail its cell
    from littlelm.schema import load_run

    monkeypatch.chdir(ROOT)
    shipped = load_run("configs/shakespeare_char.yaml", [])
    src = shipped.data.sources["shakespeare"]
    assert (src.split, src.max_chars, src.cut) == ("file", 127, "anywhere")
    assert src.max_chars == shipped.train.seq_len - 1  # a piece and its BOS: one row
    for name, overrides in race.VARIANTS.items():
        cfg = load_run("configs/shakespeare_char.yaml", overrides)
        assert (cfg == shipped) == (name == "shipped"), name
    pieces = load_run("configs/shakespeare_char.yaml", race.VARIANTS["pieces"]).data
    assert (pieces.sources["shakespeare"].cut, pieces.sources["shakespeare"].max_chars) == (
        "paragraphs",
        256,
    )
