"""The data layer's registered components: tokenizers and document sources. `register()` is
called by `littlelm.components.register_all()` and by a data-preparation worker process (an
entry point of its own, which imports no torch: the prepared-shards source, data/build.py,
is registered by register_all)."""

from __future__ import annotations

from littlelm.registry import DATASETS, TOKENIZERS


def register() -> None:
    """Register every tokenizer and source (idempotent)."""
    from littlelm.data import conversations, foreign, hub, records, sources, tiktoken_tokenizer
    from littlelm.data import tokenizer as tok

    TOKENIZERS.register("byte", config=tok.ByteConfig)(tok.ByteTokenizer)
    TOKENIZERS.register("bpe", config=tok.BPEConfig)(tok.BPETokenizer)
    TOKENIZERS.register("huggingface", config=tok.HuggingFaceConfig)(tok.HuggingFaceJSON)
    TOKENIZERS.register("saved", config=tok.SavedConfig)(tok.SavedTokenizer)
    TOKENIZERS.register("tiktoken", config=tiktoken_tokenizer.TiktokenConfig)(
        tiktoken_tokenizer.TiktokenTokenizer
    )
    DATASETS.register("text", config=sources.TextConfig)(sources.TextFiles)
    DATASETS.register("python", config=sources.PythonConfig)(sources.PythonFiles)
    DATASETS.register("python_stdlib", config=sources.StdlibConfig)(sources.PythonStdlib)
    DATASETS.register("jsonl", config=records.JSONLConfig)(records.JSONLFiles)
    DATASETS.register("parquet", config=records.ParquetConfig)(records.ParquetFiles)
    DATASETS.register("hf", config=hub.HFConfig)(hub.HubDataset)
    DATASETS.register("tokens", config=foreign.TokensConfig)(foreign.TokenFiles)
    DATASETS.register("chat", config=conversations.ChatConfig)(conversations.ChatSource)
