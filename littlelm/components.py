"""Imports every module that registers components, so that all registries are full.

A new component module is added here once; nothing else needs to know about it.
"""

import littlelm.data.build
import littlelm.data.hub
import littlelm.data.records
import littlelm.data.sources
import littlelm.data.tiktoken_tokenizer
import littlelm.data.tokenizer
import littlelm.eval.callback
import littlelm.model.gpt
import littlelm.optim.groups
import littlelm.optim.schedule
import littlelm.train.callbacks
import littlelm.train.loggers  # noqa: F401
