"""Models. Importing this package registers them."""

from littlelm.model.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
