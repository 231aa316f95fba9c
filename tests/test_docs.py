"""The generated configuration reference matches the code."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_configuration_reference_is_current():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_config_docs.py"), "--check"],
        capture_output=True,
    )
    assert done.returncode == 0, (
        "docs/configuration.md is stale: run python scripts/gen_config_docs.py"
    )
