"""Models in and out of littlelm: Hugging Face export/import (hf.py), lm-evaluation-harness
(harness.py). This layer sits beside plan/report/eval: it may import train, model and data,
and nothing below it imports it."""
