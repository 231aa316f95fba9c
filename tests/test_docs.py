"""The generated configuration reference matches the code."""

import ast
import re
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


HOW_TO = ROOT / "docs" / "architecture.md"
NAMED = re.compile(r"`((?:littlelm|tests|scripts|benchmarks|docs|configs)/[\w/.-]+)(?::(\w+))?`")


def how_to_change_rows() -> list[tuple[str, list[tuple[str, str | None]]]]:
    """(change, [(file, name it defines or None)]) per row of the "How to change it" table."""
    text = HOW_TO.read_text()
    section = text.split("## How to change it", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or set(cells[0]) <= {"-", " "} or cells[0] == "to add":
            continue
        rows.append((cells[0], NAMED.findall(cells[1])))
    return rows


def defines(path: Path, name: str) -> bool:
    """Whether a Python file defines `name` at its top level or in a class (def, class or
    assignment), or another file contains it."""
    if path.suffix != ".py":
        return name in path.read_text()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.name == name
        ):
            return True
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def test_how_to_change_table_names_files_and_things_that_exist():
    """docs/architecture.md's "How to change it" table: every named file exists and defines the
    thing named beside it, and no change touches more than three files."""
    rows = how_to_change_rows()
    assert len(rows) >= 6, "the table lost rows"
    problems = []
    for change, named in rows:
        files = {f for f, _ in named}
        if not files:
            problems.append(f"{change}: names no file")
        if len(files) > 3:
            problems.append(f"{change}: {len(files)} files ({', '.join(sorted(files))}); at most 3")
        for f, name in named:
            path = ROOT / f
            if not path.is_file():
                problems.append(f"{change}: {f} does not exist")
            elif name and not defines(path, name):
                problems.append(f"{change}: {f} does not define {name}")
    assert not problems, "\n".join(problems)
