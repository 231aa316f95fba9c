"""littlelm: train small decoder-only language models from one YAML file."""

__version__ = "0.1.0"
