"""Models (registered by littlelm.components.register_all)."""

from littlelm.model.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
