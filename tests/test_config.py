from __future__ import annotations

import pytest
import yaml

from littlelm.config import apply_overrides, flatten, load_tree, to_tree, validate
from littlelm.errors import ConfigError, LittleLMError
from littlelm.schema import PACKAGED_CONFIGS, RunConfig, load_run, read_run


def test_include_merges_and_later_files_win(tmp_path, corpus):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "base.yaml").write_text("model: {n_layer: 3, d_model: 64, n_head: 2}\n")
    (tmp_path / "run.yaml").write_text(
        "include: models/base.yaml\nmodel: {n_layer: 5}\n"
        f"data: {{tokenizer: byte, sources: {{t: {{name: text, path: {corpus}}}}}}}\n"
        "train: {max_steps: 1}\n"
    )
    cfg = load_run(tmp_path / "run.yaml", ["model.d_model=96"])
    assert (cfg.model.n_layer, cfg.model.d_model, cfg.model.n_head) == (5, 96, 2)


def test_include_takes_a_packaged_configs_name(tmp_path):
    (tmp_path / "mine.yaml").write_text("include: [demo]\nmodel: {n_layer: 2}\n")
    cfg = load_run(tmp_path / "mine.yaml")
    assert cfg.model.n_layer == 2 and cfg.model.d_model == 256  # the rest is demo's
    assert cfg.data.tokenizer.name == "bpe"
    (tmp_path / "typo.yaml").write_text("include: [dmeo]\n")
    with pytest.raises(ConfigError, match="include: file not found.*nor a packaged config.*demo"):
        load_run(tmp_path / "typo.yaml")


def test_a_component_switched_by_name_starts_afresh(tmp_path, corpus):
    # demo's tokenizer is {name: bpe, vocab_size: 4096}: byte has no vocab_size
    (tmp_path / "byte.yaml").write_text("include: [demo]\ndata: {tokenizer: {name: byte}}\n")
    cfg = load_run(tmp_path / "byte.yaml")
    assert cfg.data.tokenizer.name == "byte"
    assert load_run("demo", ["data.tokenizer.name=byte"]).data.tokenizer.name == "byte"
    # the same name merges as before; a source switched by name drops the old source's keys
    (tmp_path / "src.yaml").write_text(
        "include: [demo]\n"
        f"data: {{tokenizer: {{vocab_size: 512}}, sources: {{stdlib: {{name: text, path: {corpus}}}}}}}\n"
    )
    cfg = load_run(tmp_path / "src.yaml")
    assert (cfg.data.tokenizer.name, cfg.data.tokenizer.vocab_size) == ("bpe", 512)
    assert cfg.data.sources["stdlib"].name == "text"  # demo's max_chars (python_stdlib) is gone
    # keys an earlier override set for the new component stay
    cfg = load_run("demo", ["optimizer.lr=0.01", "optimizer.name=adamw"])
    assert (cfg.optimizer.name, cfg.optimizer.lr) == ("adamw", 0.01)
    assert load_run("demo", ["run.name=other"]).run.out_dir == load_run("demo").run.out_dir


def test_overrides_parse_yaml_values(tmp_path):
    tree, origin = {}, {}
    apply_overrides(tree, origin, ["a.b=3", "a.c=true", "a.d=[1, 2]", "e=3e-4", "f=hello"])
    assert tree == {"a": {"b": 3, "c": True, "d": [1, 2]}, "e": 3e-4, "f": "hello"}
    assert origin["a.b"] == "command line"


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="expected dotted.key=value"):
        apply_overrides({}, {}, ["train.max_steps"])


def test_every_problem_reported_at_once_with_key_file_and_hint(tmp_path, tiny_config):
    tree = yaml.safe_load(tiny_config.read_text())
    tree["model"]["n_layr"] = 3  # misspelled key
    tree["train"]["max_steps"] = "many"  # wrong type
    tree["optimizer"]["name"] = "adamm"  # unknown component
    tree["schedule"]["warmup_step"] = 3  # misspelled key inside a component
    tiny_config.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError) as info:
        load_run(tiny_config)
    msg = str(info.value)
    assert "4 problem(s)" in msg
    assert "model.n_layr" in msg and "did you mean 'n_layer'" in msg and str(tiny_config) in msg
    assert "train.max_steps" in msg and "'many'" in msg
    assert "optimizer.name" in msg and "did you mean 'adamw'" in msg and "muon" in msg
    assert "schedule.warmup_step" in msg and "did you mean 'warmup_steps'" in msg


def test_problem_names_the_included_file(tmp_path, corpus):
    (tmp_path / "base.yaml").write_text("model: {n_hed: 2}\n")
    (tmp_path / "run.yaml").write_text(
        f"include: base.yaml\ndata: {{tokenizer: byte, sources: {{t: {{name: text, path: {corpus}}}}}}}\n"
        "train: {max_steps: 1}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_run(tmp_path / "run.yaml")
    assert "model.n_hed" in str(info.value) and "base.yaml" in str(info.value)


def test_override_errors_name_the_command_line(tiny_config):
    with pytest.raises(ConfigError, match=r"train\.micro_batch_size \(command line\)"):
        load_run(tiny_config, ["train.micro_batch_size=0"])


def test_malformed_yaml_names_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  n_layer: 2\n   d_model: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:3:\d+: malformed YAML"):
        load_run(bad)


def test_missing_config_file_lists_packaged(tmp_path):
    with pytest.raises(ConfigError, match="config file not found.*demo"):
        load_run(tmp_path / "nope.yaml")


def test_include_cycle(tmp_path):
    (tmp_path / "a.yaml").write_text("include: b.yaml\n")
    (tmp_path / "b.yaml").write_text("include: a.yaml\n")
    with pytest.raises(ConfigError, match="include cycle"):
        load_tree(tmp_path / "a.yaml")


def test_cross_field_checks(tiny_config):
    with pytest.raises(ConfigError) as info:
        load_run(tiny_config, ["model.n_head=3", "train.batch_tokens=100"])
    msg = str(info.value)
    assert "not divisible by n_head" in msg


def test_derived_values_are_resolved(tiny_config):
    cfg = load_run(tiny_config, ["train.batch_tokens=512"])
    assert cfg.model.vocab_size == 257  # byte tokenizer
    assert cfg.train.grad_accum == 4  # 512 / (4 × 32)
    assert cfg.train.max_tokens == 6 * 512


def test_absent_sections_take_their_defaults(tmp_path):
    """A run file may leave out whole sections: each gets its defaults (data's default has no
    source, which is then named as the problem, not a type error)."""
    path = tmp_path / "nodata.yaml"
    path.write_text("run: {name: x}\ntrain: {max_steps: 2}\n")
    with pytest.raises(ConfigError) as info:
        load_run(path)
    msg = str(info.value)
    assert "data.sources is empty: a run needs a data section" in msg and "demo.yaml" in msg
    assert "expected a mapping" not in msg and len(info.value.problems) == 1
    cfg = validate(RunConfig, {})
    assert cfg.data.tokenizer.name == "bpe" and cfg.data.sources == {}
    assert cfg.checkpoint.keep_last == 2 and cfg.guard.enabled


def test_batch_tokens_not_multiple_suggests_fix(tiny_config):
    with pytest.raises(ConfigError, match="use 512"):
        load_run(tiny_config, ["train.batch_tokens=500"])


def test_resolved_config_round_trips(tiny_config):
    cfg = load_run(tiny_config)
    again = validate(RunConfig, yaml.safe_load(yaml.safe_dump(to_tree(cfg))))
    assert to_tree(again) == to_tree(cfg)


@pytest.mark.parametrize("path", sorted(PACKAGED_CONFIGS.rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths in a config resolve against an empty directory
    tree, origin, _ = read_run(path)  # as the CLI reads it: a renamed component starts afresh
    base = (tree.get("sft") or {}).get("base") or (tree.get("grow") or {}).get("parent")
    if base is None:
        assert load_run(path).train.max_steps >= 1
        return
    # A config that fine-tunes a base run (sft_demo: runs/demo) validates as typed, and without
    # its base it fails with a clear error naming the base's path, not a traceback: at loading
    # when it reads its vocabulary from the base's saved tokenizer (data.tokenizer: saved),
    # else where growth looks its parent up, at start-up (complete_growth).
    from littlelm.train.growth import complete_growth, find_parent

    validate(RunConfig, tree, origin, str(path))
    try:
        complete_growth(load_run(path))
    except LittleLMError as e:
        assert base in str(e)
    else:  # nothing derived from the base (3b_sft: no value embeddings): the start reads it
        assert not load_run(path).model.value_embeds
        with pytest.raises(LittleLMError, match=base):
            find_parent(base, "sft.base")


def test_an_sft_run_under_grow_reads_as_sft_and_growth_stays_growth(tmp_path, corpus):
    from conftest import tiny_tree, write_config

    chat = {"name": "chat", "dataset": str(corpus)}
    tree = tiny_tree(corpus, tmp_path)
    tree["data"]["sources"] = {"c": chat}
    tree["grow"] = {"parent": "runs/base"}
    with pytest.warns(UserWarning, match=r"grow: section is read as sft: .*post-training"):
        cfg = load_run(write_config(tmp_path / "old.yaml", tree))
    # grow's continue_data default (true) is kept: the same run as before
    assert cfg.grow is None and (cfg.sft.base, cfg.sft.continue_data) == ("runs/base", True)
    # an error in a translated key names its new place and the file that set it
    tree["grow"]["verify_tokens"] = -1
    with pytest.warns(UserWarning), pytest.raises(ConfigError, match=r"sft\.verify_tokens \(.*old"):
        load_run(write_config(tmp_path / "old.yaml", tree))
    # growth's own settings, or no chat source: growth, as written
    for grow, sources in (
        ({"parent": "runs/base", "placement": "end"}, {"c": chat}),
        ({"parent": "runs/base"}, tiny_tree(corpus, tmp_path)["data"]["sources"]),
    ):
        tree["grow"], tree["data"]["sources"] = grow, sources
        cfg = load_run(write_config(tmp_path / "grow.yaml", tree))
        assert cfg.sft is None and cfg.grow.parent == "runs/base"
    tree["sft"] = {"base": "runs/base"}
    with pytest.raises(ConfigError, match="grow and sft are both set"):
        load_run(write_config(tmp_path / "both.yaml", tree))


def test_every_config_field_has_a_description():
    from littlelm.config import slot

    classes = {RunConfig}
    seen, missing = set(), []
    while classes:
        cls = classes.pop()
        seen.add(cls)
        for name, field in cls.model_fields.items():
            if not field.description:
                missing.append(f"{cls.__name__}.{name}")
            meta = slot(field)  # a component field: every class it may hold
            classes.update(c for c in (meta.classes.values() if meta else ()) if c not in seen)
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields") and ann not in seen:
                classes.add(ann)
    assert not missing, missing


def test_flatten():
    assert flatten({"a": {"b": 1, "c": [{"d": 2}]}}) == {"a.b": 1, "a.c[0].d": 2}


def test_shakespeare_char_trains_from_the_repository_root(tmp_path, monkeypatch):
    """The classic example reads the Tiny Shakespeare shipped in data/, so a fresh clone runs it."""
    from pathlib import Path

    from littlelm.train.trainer import Trainer

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)  # config paths are relative to the directory littlelm runs from
    cfg = load_run(
        "configs/shakespeare_char.yaml",
        [
            "train.max_steps=1",
            "eval.every=0",
            "eval.at_end=false",
            f"run.out_dir={tmp_path}",
            "train.micro_batch_size=2",
        ],
    )
    text = Path(cfg.data.sources["shakespeare"].path)
    assert not text.is_absolute() and text.resolve().is_relative_to(root)
    assert text.stat().st_size == 1_115_394
    result = Trainer(cfg, resume="never").fit()
    assert result["finished"] and result["step"] == 1
