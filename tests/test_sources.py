"""Document sources: formats, units, and bad input (counted skip or clear error)."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from littlelm.data.records import JSONLConfig, JSONLFiles, ParquetConfig, ParquetFiles
from littlelm.data.sources import PythonConfig, PythonFiles, TextConfig, TextFiles, Unit
from littlelm.errors import DataError

DOCS = [f"document {i}: " + "words and more words " * (i % 7 + 1) for i in range(60)]


def jsonl_bytes(docs, field="text") -> bytes:
    return "".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()


def jsonl(tmp_path, **kw) -> JSONLFiles:
    return JSONLFiles(JSONLConfig(name="jsonl", path=str(tmp_path), **kw), "web")


def all_docs(src, target=1 << 30) -> list[str]:
    return [d for u in src.units(target) for d in src.unit_documents(u)]


def test_jsonl_plain_gzip_zstd_read_alike(tmp_path):
    data = jsonl_bytes(DOCS)
    (tmp_path / "a.jsonl").write_bytes(data)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    (tmp_path / "notes.md").write_text("not an input")
    src = jsonl(tmp_path)
    assert [f.name for f in src.files()] == ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst"]
    assert all_docs(src) == DOCS * 3 and not src.skipped


def test_jsonl_nested_field(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"meta": {"body": "hello"}}) + "\n")
    assert all_docs(jsonl(tmp_path, field="meta.body")) == ["hello"]


BAD_LINES = [
    (b"{not json\n", "malformed JSON"),
    (b'{"other": "x"}\n', "missing field 'text'"),
    (b'{"text": 5}\n', "field 'text' is not a string"),
    (b'{"text": "bad \xff byte"}\n', "invalid UTF-8"),
    (b'{"text": "lone \\ud800 surrogate"}\n', "invalid UTF-8"),
]


@pytest.mark.parametrize("line, reason", BAD_LINES, ids=[r for _, r in BAD_LINES])
def test_jsonl_bad_record_is_counted_or_fails(tmp_path, line, reason):
    (tmp_path / "a.jsonl").write_bytes(b'{"text": "good"}\n' + line + b'{"text": "also good"}\n')
    src = jsonl(tmp_path)
    assert all_docs(src) == ["good", "also good"]
    assert dict(src.skipped) == {reason: 1}
    strict = jsonl(tmp_path, on_error="fail")
    with pytest.raises(DataError, match=rf"a\.jsonl \(line 2.*{reason[:12]}.*on_error=skip"):
        all_docs(strict)


def test_empty_document_counted_or_fails(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n{"text": "  "}\n')
    src = jsonl(tmp_path)
    assert all_docs(src) == ["x"] and dict(src.skipped) == {"empty document": 1}
    with pytest.raises(DataError, match="empty document.*on_empty=skip"):
        all_docs(jsonl(tmp_path, on_empty="fail"))


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_truncated_compressed_file_keeps_what_it_read(tmp_path, kind):
    data = jsonl_bytes(DOCS * 20)
    blob = gzip.compress(data) if kind == "gz" else zstandard.ZstdCompressor().compress(data)
    (tmp_path / f"a.jsonl.{kind}").write_bytes(blob[: len(blob) // 2])
    src = jsonl(tmp_path)
    docs = all_docs(src)
    assert len(docs) < len(DOCS) * 20 and docs == (DOCS * 20)[: len(docs)]  # a clean prefix
    assert len(src.skipped) == 1 and "unreadable file" in next(iter(src.skipped))
    with pytest.raises(DataError, match="unreadable file"):
        all_docs(jsonl(tmp_path, on_error="fail"))


def test_unreadable_file_counted(tmp_path):
    src = TextFiles(TextConfig(name="text", path=str(tmp_path)), "t")
    assert list(src.unit_documents(Unit((str(tmp_path / "gone.txt"),)))) == []
    assert "unreadable file" in next(iter(src.skipped))


def test_text_split_modes_and_bad_utf8(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"one\ntwo\n\nthree\n\n\n\nfour \xff\n\nfive\n")
    para = TextFiles(TextConfig(name="text", path=str(tmp_path), split="paragraph"), "t")
    assert all_docs(para) == ["one\ntwo\n", "three\n", "five\n\n"]
    assert dict(para.skipped) == {"invalid UTF-8 (byte 5)": 1}
    lines = TextFiles(TextConfig(name="text", path=str(tmp_path), split="line"), "t")
    assert all_docs(lines) == ["one", "two", "three", "five"]
    whole = TextFiles(TextConfig(name="text", path=str(tmp_path)), "t")
    assert all_docs(whole) == [] and "invalid UTF-8" in next(iter(whole.skipped))


def parquet(tmp_path, table, **kw) -> ParquetFiles:
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=7)
    return ParquetFiles(ParquetConfig(name="parquet", path=str(tmp_path), **kw), "pm")


def test_parquet_column_nulls_and_row_group_units(tmp_path):
    texts = [*DOCS[:20], None, *DOCS[20:40]]
    src = parquet(tmp_path, pa.table({"abstract": texts, "n": range(41)}), column="abstract")
    assert all_docs(src) == DOCS[:40] and dict(src.skipped) == {
        "missing value in column 'abstract'": 1
    }
    units = src.units(200)  # several ranges of row groups
    assert len(units) > 2 and all_docs(src, 200) == DOCS[:40]


def test_parquet_missing_or_wrong_column(tmp_path):
    src = parquet(tmp_path, pa.table({"body": DOCS}))
    assert all_docs(src) == [] and "missing column 'text' (columns: body)" in next(
        iter(src.skipped)
    )
    strict = parquet(tmp_path, pa.table({"body": DOCS}), on_error="fail")
    with pytest.raises(DataError, match=r"p\.parquet: missing column 'text' \(columns: body\)"):
        all_docs(strict)
    numbers = parquet(tmp_path, pa.table({"text": list(range(5))}))
    assert all_docs(numbers) == [] and "holds int64, not text" in next(iter(numbers.skipped))


def test_corrupt_parquet_is_unreadable(tmp_path):
    (tmp_path / "p.parquet").write_bytes(b"PAR1 garbage " * 50)
    src = ParquetFiles(ParquetConfig(name="parquet", path=str(tmp_path)), "pm")
    assert all_docs(src) == [] and "unreadable file" in next(iter(src.skipped))


def test_python_tree_skips_caches_hidden_and_optionally_tests(tmp_path):
    for rel in ["pkg/a.py", "pkg/tests/t.py", "pkg/__pycache__/a.py", ".venv/x.py", "b.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"# {rel}\n")
    (tmp_path / "pkg/empty.py").write_text("")
    src = PythonFiles(PythonConfig(name="python", path=str(tmp_path)), "code")
    names = sorted(f.relative_to(tmp_path).as_posix() for f in src.files())
    assert names == ["b.py", "pkg/a.py", "pkg/empty.py", "pkg/tests/t.py"]
    assert len(all_docs(src)) == 3 and dict(src.skipped) == {"empty document": 1}
    no_tests = PythonFiles(
        PythonConfig(name="python", path=str(tmp_path), include_tests=False), "c"
    )
    assert "pkg/tests/t.py" not in {f.relative_to(tmp_path).as_posix() for f in no_tests.files()}


@pytest.mark.parametrize("split", ["paragraph", "line"])
def test_units_cut_text_without_changing_documents(tmp_path, split):
    (tmp_path / "big.txt").write_text("\n\n".join(DOCS) + "\n\n\n" + "\n".join(DOCS))
    src = TextFiles(TextConfig(name="text", path=str(tmp_path), split=split), "t")
    whole = all_docs(src)
    for target in (50, 333, 1000):
        units = src.units(target)
        assert len(units) > 1 and all_docs(src, target) == whole


def test_units_cut_jsonl_and_group_small_files(tmp_path):
    (tmp_path / "big.jsonl").write_bytes(jsonl_bytes(DOCS))
    for i in range(5):
        (tmp_path / f"small{i}.jsonl").write_bytes(jsonl_bytes(DOCS[:2]))
    src = jsonl(tmp_path)
    units = src.units(400)
    assert any(u.stop is not None for u in units)  # the big file is cut into ranges
    assert any(len(u.files) > 1 for u in units)  # small files are grouped
    assert all_docs(src, 400) == all_docs(src)


def test_missing_input_names_key_and_fix(tmp_path):
    src = jsonl(tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"data\.sources\.web\.path: no JSONL files at .*=PATH"):
        src.files()


def test_path_list_and_glob(tmp_path):
    for name in ("a.txt", "b.txt", "c.log"):
        (tmp_path / name).write_text(name)
    spec = [str(tmp_path / "b.txt"), str(tmp_path / "*.log"), str(tmp_path / "b.txt")]
    src = TextFiles(TextConfig(name="text", path=spec), "t")
    assert [f.name for f in src.files()] == ["b.txt", "c.log"]
