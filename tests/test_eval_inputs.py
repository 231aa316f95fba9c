"""What `littlelm eval` reads: file encodings, llm-foundry/DCLM/nanochat task lists, bundle layouts."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import make_corpus, make_task_dir, tiny_tree, write_config
from littlelm.cli import main
from littlelm.errors import EvalError
from littlelm.eval.core import is_full_core, load_suite
from littlelm.eval.prompts import render
from littlelm.eval.run import tasks_and_data
from littlelm.eval.tasks import (
    CORE_TASKS,
    TaskSpec,
    bundle_differences,
    load_items,
    load_task_list,
    resolve_bundle,
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real checkpoint (1 step of a tiny run): input errors must show whatever eval checks first."""
    import io

    from littlelm.progress import Progress
    from littlelm.schema import load_run
    from littlelm.train.trainer import Trainer

    tmp = tmp_path_factory.mktemp("run")
    train = {"max_steps": 1, "precision": "fp32"}
    tree = tiny_tree(make_corpus(tmp / "corpus.txt"), tmp / "runs", train=train)
    tree["eval"]["every"], tree["optimizer"] = 0, {"name": "adamw"}  # fast on a CPU
    Trainer(load_run(write_config(tmp / "run.yaml", tree)), progress=Progress(io.StringIO())).fit()
    return tmp / "runs" / "tiny"


GOOD = json.dumps({"query": "q", "choices": ["a", "b"], "gold": 1})


def mc_task(**kw) -> TaskSpec:
    base = dict(label="t", dataset_uri="t.jsonl", icl_task_type="multiple_choice", num_fewshot=0)
    return TaskSpec(**{**base, "random_baseline": 50, **kw})


# --- files that are not UTF-8 -------------------------------------------------------------


def test_jsonl_not_utf8_names_file_line_byte_and_column(tmp_path):
    path = tmp_path / "t.jsonl"
    # line 2: '{"query": "é' is 12 characters (13 bytes), then a Latin-1 'é' (0xe9)
    bad = '{"query": "é'.encode() + b'\xe9", "choices": ["a", "b"], "gold": 0}'
    path.write_bytes(GOOD.encode() + b"\n" + bad + b"\n" + GOOD.encode() + b"\n")
    with pytest.raises(EvalError) as e:
        load_items(path, mc_task())
    assert str(e.value).startswith(f"{path}:2: not valid UTF-8 (byte 0xe9 at column 13); ")
    assert "as UTF-8" in str(e.value)


def test_task_list_and_meta_csv_not_utf8(tmp_path):
    path = tmp_path / "tasks.yaml"
    path.write_bytes(b"# tasks\ntasks:\n  - {label: caf\xe9}\n")
    with pytest.raises(
        EvalError, match=r"tasks.yaml:3: not valid UTF-8 \(byte 0xe9 at column 16\)"
    ):
        load_task_list(path)
    icl = tmp_path / "core.yaml"
    icl.write_text(yaml.safe_dump({"icl_tasks": [dclm_entry(load_task_list()[0])]}))
    (tmp_path / "eval_meta_data.csv").write_bytes(b"Eval Task,Random baseline\nx\xff,1\n")
    with pytest.raises(EvalError, match=r"eval_meta_data.csv:2: not valid UTF-8 \(byte 0xff"):
        load_task_list(icl)
    # the bundle's own core.yaml is only compared with littlelm's list: a warning, not a stop
    (tmp_path / "core.yaml").write_bytes(b"icl_tasks:\n- label: \xff\n")
    (warning,) = bundle_differences(tmp_path, load_task_list())
    assert "core.yaml:2: not valid UTF-8 (byte 0xff at column 10)" in warning


@pytest.mark.parametrize("where", ["jsonl", "task-file"])
def test_eval_cli_reports_bad_utf8_without_traceback(run_dir, tmp_path, capsys, where):
    tasks = make_task_dir(tmp_path / "tasks", items=8)
    args = ["eval", str(run_dir), "--bundle", str(tasks)]
    if where == "jsonl":
        (tasks / "lm.jsonl").write_bytes(b'{"context": "1 + 1 =", "continuation": " 2\xc3"}\n')
        expected = "lm.jsonl:1: not valid UTF-8 (byte 0xc3 at column 43)"
    else:
        (tmp_path / "t.yaml").write_bytes(b"tasks:\n- label: \x80\n")
        args += ["--task-file", str(tmp_path / "t.yaml")]
        expected = "t.yaml:2: not valid UTF-8 (byte 0x80 at column 10)"
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and expected in err
    assert "Traceback" not in err and "UnicodeDecodeError" not in err


# --- llm-foundry / DCLM / nanochat task lists (icl_tasks:) ----------------------------------


def dclm_entry(spec: TaskSpec, prefix: str = "local_data/") -> dict:
    """A packaged CORE task written as DCLM's eval/mmlu_and_lowvar.yaml writes it."""
    entry = {
        "label": spec.label,
        "dataset_uri": prefix + spec.dataset_uri,
        "num_fewshot": [spec.num_fewshot],
        "icl_task_type": spec.icl_task_type,
    }
    if spec.continuation_delimiter != " ":  # DCLM leaves llm-foundry's default out
        entry["continuation_delimiter"] = spec.continuation_delimiter
    if spec.label == "jeopardy":
        entry["has_categories"] = True
    return entry


def test_dclm_core_yaml_maps_to_the_packaged_core_tasks(tmp_path):
    core = load_task_list()
    path = tmp_path / "mmlu_and_lowvar.yaml"
    # DCLM's file is a whole llm-foundry run config; only icl_tasks describes tasks
    tree = {"max_seq_len": 2048, "model": {"name": "open_lm"}}
    path.write_text(yaml.safe_dump({**tree, "icl_tasks": [dclm_entry(s) for s in core]}))
    specs = load_task_list(path)
    assert specs == core and is_full_core(specs)


def test_nanochat_bundle_core_yaml_scores_as_core(tmp_path):
    """nanochat's bundle: core.yaml (icl_tasks) + eval_meta_data.csv + eval_data/."""
    core = load_task_list()
    bundle = tmp_path / "eval_bundle"
    for s in core:
        path = bundle / "eval_data" / s.dataset_uri
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = {
            "multiple_choice": {"query": "q", "choices": ["a", "b"], "gold": 0},
            "schema": {"context_options": ["a", "b"], "continuation": "c", "gold": 0},
            "language_modeling": {"context": "a", "continuation": "b"},
        }[s.icl_task_type]
        path.write_text((json.dumps(rows) + "\n") * (s.num_fewshot + 2))
    (bundle / "core.yaml").write_text(
        yaml.safe_dump({"icl_tasks": [dclm_entry(s, "") for s in core]})
    )
    csv_rows = "".join(f'{s.label},"desc, with a comma",{s.random_baseline}\n' for s in core)
    (bundle / "eval_meta_data.csv").write_text(
        "Eval Task,Task description,Random baseline\n" + csv_rows
    )
    tasks, data_dir = tasks_and_data(bundle, bundle / "core.yaml", None)
    assert data_dir == bundle / "eval_data" and is_full_core(tasks)
    assert len(load_suite(tasks, data_dir)) == 22
    # the csv beside the file wins over the packaged baselines
    (bundle / "eval_meta_data.csv").write_text("Eval Task,Random baseline\ncopa,40\n")
    specs = {s.label: s for s in load_task_list(bundle / "core.yaml")}
    assert specs["copa"].random_baseline == 40 and not is_full_core(list(specs.values()))
    (bundle / "eval_meta_data.csv").write_text("Eval Task,Random baseline\ncopa,half\n")
    with pytest.raises(EvalError, match=r"eval_meta_data.csv:2: expected .* 'Random baseline'"):
        load_task_list(bundle / "core.yaml")


def test_llm_foundry_shot_lists_become_one_task_per_count(tmp_path):
    path = tmp_path / "tasks_v0.3.yaml"
    entries = [
        {
            "label": "hellaswag",
            "dataset_uri": "eval/local_data/language_understanding/hellaswag.jsonl",
            "num_fewshot": [0, 10],
            "icl_task_type": "multiple_choice",
        },
        {
            "label": "my_lm",
            "dataset_uri": "mine/my_lm.jsonl",
            "num_fewshot": [2],
            "icl_task_type": "language_modeling",
            "continuation_delimiter": "",
            "example_delimiter": "\n",
            "batch_size": 8,
        },
    ]
    path.write_text(yaml.safe_dump({"icl_tasks": entries}))
    specs = load_task_list(path)
    assert [(s.label, s.num_fewshot) for s in specs] == [
        ("hellaswag/0-shot", 0),
        ("hellaswag/10-shot", 10),
        ("my_lm", 2),
    ]
    assert specs[0].dataset_uri == "language_understanding/hellaswag.jsonl"
    assert specs[0].random_baseline == 25  # hellaswag's CORE baseline
    assert specs[0].example_delimiter == "\n\n"  # nanochat's, when the entry sets none
    lm = specs[2]
    assert lm.dataset_uri == "mine/my_lm.jsonl" and lm.random_baseline == 0
    assert lm.example_delimiter == "\n" and lm.continuation_delimiter == ""


def test_example_delimiter_separates_the_examples():
    shots = [{"context": "1+1=", "continuation": "2"}, {"context": "2+2=", "continuation": "4"}]
    item = {"context": "3+3=", "continuation": "6"}
    task = mc_task(icl_task_type="language_modeling", continuation_delimiter="", num_fewshot=2)
    assert render(task, item, shots)[0][1] == "1+1=2\n\n2+2=4\n\n3+3=6"
    task = task.model_copy(update={"example_delimiter": "\n"})
    assert render(task, item, shots)[0][1] == "1+1=2\n2+2=4\n3+3=6"


def test_unsupported_icl_fields_and_types_are_refused_by_name(tmp_path):
    path = tmp_path / "tasks.yaml"
    entries = [
        {
            "label": "gsm8k",
            "dataset_uri": "eval/local_data/symbolic_problem_solving/gsm8k.jsonl",
            "num_fewshot": [0],
            "icl_task_type": "generation_task_with_answers",
            "cot_delimiter": "The answer is ",
            "early_stopping_criteria": ["\n\n"],
        },
        {
            "label": "my_mc",
            "dataset_uri": "my_mc.jsonl",
            "num_fewshot": [1],
            "icl_task_type": "multiple_choice",
        },
    ]
    path.write_text(yaml.safe_dump({"icl_tasks": entries}))
    with pytest.raises(EvalError) as e:
        load_task_list(path)
    msg = str(e.value)
    assert "gsm8k: unsupported field(s) cot_delimiter, early_stopping_criteria" in msg
    assert "gsm8k: icl_task_type 'generation_task_with_answers' is not supported" in msg
    assert "my_mc: no random baseline: add `random_baseline: PERCENT`" in msg
    assert msg.startswith(str(path))
    path.write_text("icl_tasks: eval/yamls/tasks_v0.3.yaml\n")
    with pytest.raises(
        EvalError, match="icl_tasks names another file .*pass that file as --task-file"
    ):
        load_task_list(path)
    path.write_text(yaml.safe_dump({"tasks": [], "icl_tasks": entries}))
    with pytest.raises(EvalError, match="both `tasks:` and `icl_tasks:`"):
        load_task_list(path)


# --- bundle layouts --------------------------------------------------------------------------


def llm_foundry_checkout(root):
    """llm-foundry's scripts/eval: local_data/<category>/*.jsonl beside yamls/."""
    evaldir = root / "scripts" / "eval"
    tasks = make_task_dir(evaldir / "local_data" / "mine", items=8)
    (tasks / "tasks.yaml").unlink()
    (evaldir / "yamls").mkdir()
    entries = [
        {
            "label": "mc_words",
            "dataset_uri": "eval/local_data/mine/mc.jsonl",
            "num_fewshot": [0, 3],
            "icl_task_type": "multiple_choice",
            "random_baseline": 25,
        }
    ]
    (evaldir / "yamls" / "tasks.yaml").write_text(yaml.safe_dump({"icl_tasks": entries}))
    return evaldir


def test_llm_foundry_scripts_eval_layout(tmp_path):
    evaldir = llm_foundry_checkout(tmp_path / "llm-foundry")
    assert resolve_bundle(evaldir) == (CORE_TASKS, evaldir / "local_data")
    tasks, data_dir = tasks_and_data(evaldir, evaldir / "yamls" / "tasks.yaml", None)
    assert data_dir == evaldir / "local_data"
    assert [t.label for t in tasks] == ["mc_words/0-shot", "mc_words/3-shot"]
    assert [len(items) for _, items in load_suite(tasks, data_dir)] == [8, 8]
    # the local_data folder itself, as before
    assert tasks_and_data(evaldir / "local_data", evaldir / "yamls" / "tasks.yaml", None)[1] == (
        evaldir / "local_data"
    )


def test_a_folder_without_the_task_files_names_the_one_to_point_at(run_dir, tmp_path, capsys):
    root = tmp_path / "llm-foundry"
    evaldir = llm_foundry_checkout(root)
    task_file = evaldir / "yamls" / "tasks.yaml"
    with pytest.raises(EvalError) as e:
        tasks_and_data(root, task_file, None)  # the checkout's root: too high
    assert (
        f"they are under {evaldir / 'local_data'}: pass --bundle {evaldir / 'local_data'}"
        in str(e.value)
    )
    with pytest.raises(EvalError, match="none of the 2 task files is under"):
        tasks_and_data(evaldir / "local_data" / "mine", task_file, None)  # too low
    # CORE from an empty folder: nothing to point at, so say where CORE comes from
    (tmp_path / "empty").mkdir()
    code = main(["eval", str(run_dir), "--bundle", str(tmp_path / "empty")])
    err = capsys.readouterr().err
    assert code == 2 and "error: none of the 22 task files is under" in err
    assert "littlelm eval-bundle" in err and "Traceback" not in err


@pytest.mark.parametrize("mode", ["crop", "drop_shots"])
def test_example_delimiter_scores_as_the_reference_scorer(tmp_path, mode):
    """The fast harness and the slow reference agree with a non-default example delimiter."""
    import torch

    from littlelm.data.tokenizer import ByteTokenizer
    from littlelm.eval.core import EvalOptions, evaluate_task, task_items
    from littlelm.eval.reference import reference_decisions
    from littlelm.model.gpt import GPT, GPTConfig

    d = make_task_dir(tmp_path / "t", items=12)
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(name="gpt", vocab_size=257, n_layer=1, d_model=32, n_head=2, max_seq_len=96)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.eval()
    tok = ByteTokenizer()
    for task in load_task_list(d / "tasks.yaml"):
        task = task.model_copy(update={"example_delimiter": "\n###\n"})
        data = task_items(task, d)
        opts = EvalOptions(max_per_task=3, truncation=mode, batch_tokens=2048)
        res = evaluate_task(model, tok, task, data, opts)
        assert res.decisions == reference_decisions(model, tok, task, data, res.items, mode)
