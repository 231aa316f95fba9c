"""`littlelm data inspect`: its typed function, whose docstring is its --help (cli.py registers
it; `data prepare` reads a run file, so it is littlelm/verbs.py's)."""

from __future__ import annotations

from typing import Literal

from littlelm.cli_args import Positive

# Each verb imports what it runs inside its body: `littlelm VERB --help` and tab completion import
# none of it.


def inspect(
    directory: str,
    /,
    *,
    format: Literal["nanogpt", "array", "megatron", "parquet"] | None = None,
    dtype: Literal["uint16", "uint32"] | None = None,
    separator: int | None = None,
    column: str = "input_ids",
    samples: int = 1,
    chars: int = 400,
    no_verify: bool = False,
    seq_len: Positive | None = None,
) -> None:
    """Summarise and check a prepared dataset.

    examples:
      littlelm data inspect shards/web --samples 3
      littlelm data inspect fineweb10B/   # nanoGPT/llm.c .bin, Megatron, .npy, parquet

    Args:
        directory: a dataset directory written by `littlelm data prepare`, or token files another tool wrote (nanoGPT/llm.c .bin, .npy, Megatron PREFIX, parquet; docs/data.md)
        format: token files' format (default: from the files; a headerless .bin needs array)
        dtype: a headerless .bin's tokens
        separator: id between documents (nanogpt, array); default 50256 for GPT-2 nanogpt files
        column: parquet: the token-id column
        samples: decoded sample documents to print
        chars: characters of each sample
        no_verify: skip reading every shard's checksum
        seq_len: conversations: count those too long for this seq_len
    """
    from pathlib import Path

    from littlelm.data.inspect import inspect_dataset, inspect_tokens
    from littlelm.data.prepare import MANIFEST

    path = Path(directory)
    if format or not ((path if path.is_dir() else path.parent) / MANIFEST).is_file():
        inspect_tokens(path, format, dtype, separator, column)  # token files another tool wrote
    else:
        inspect_dataset(path, samples, chars, not no_verify, seq_len=seq_len)
