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


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_docs_speak_of_the_project_not_of_its_issues():
    """A reader has no issue tracker: "as issue 8 left it", "issue 30's target" say nothing."""
    import re

    cited = re.compile(r"\b[Ii]ssues?( #?\d+|'s)|#\d{2,}\b")
    found = [
        f"{doc.name}:{n}: {line.strip()}"
        for doc in DOCS
        for n, line in enumerate(doc.read_text().splitlines(), 1)
        if cited.search(line)
    ]
    assert not found, "\n".join(found)


def test_every_extra_is_installable_from_a_clone():
    """`pip install 'littlelm[x]'` needs a package index that has littlelm; wherever the docs
    give it, the same paragraph gives the clone form `pip install -e '.[x]'` too."""
    import re

    missing = []
    for doc in DOCS:
        for para in re.split(r"\n\s*\n", doc.read_text()):
            for extra in re.findall(r"'littlelm\[([\w,]+)\]'", para):
                if f"-e '.[{extra}]'" not in para:
                    missing.append(f"{doc.name}: littlelm[{extra}]")
    assert not missing, missing
