"""The README stays a guide: its layout tree names every folder, docs/architecture.md's every module, the
README stays short, and the docs' tables and links hold.

A layout tree is the fenced block under a page's `## Layout` heading. Each line is an entry: a name, two or
more spaces, and its one-line purpose. A name ending in `/` is a folder (it may span segments, `deploy/k8s/`);
the entries indented two spaces deeper under it are inside it. So `pipeline/` then `  data/` then `    split.py`
names `pipeline/data/split.py`, and a file is matched only within its own folder's entry.

    .venv/bin/python -m pytest tests/unit/test_readme_layout.py
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pytest

LAYOUT_HEADING = "## Layout"
MAX_README_LINES = 350
MAX_CELL_CHARS = 400
MODULE_FOLDERS = ("pipeline", "flows", "benchmarks", "scripts")
EVERY_FILE_FOLDERS = ("scripts",)  # here non-Python files (shell scripts) must be listed too
_ENTRY = re.compile(r"^(?P<indent> *)(?P<name>\S+)(?: {2,}(?P<purpose>\S.*))?$")
_LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


class LayoutError(ValueError):
    """The layout tree cannot be read unambiguously (a line's indentation, or an entry under a file)."""


def layout_block(readme: str) -> list[str]:
    """The lines of the first fenced block under the `## Layout` heading."""
    lines = readme.splitlines()
    start = lines.index(LAYOUT_HEADING)
    fence = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    return lines[fence + 1 : end]


def layout_paths(block: Iterable[str]) -> dict[str, str]:
    """Every path the tree names (folders end in `/`), with its purpose ("" when the line gives none)."""
    paths: dict[str, str] = {}
    folders: list[str] = []  # the open folder at each depth
    for number, line in enumerate(block, 1):
        if not line.strip():
            continue
        entry = _ENTRY.match(line)
        depth, remainder = divmod(len(entry["indent"]), 2) if entry else (0, 1)
        if entry is None or remainder or depth > len(folders):
            raise LayoutError(f"layout line {number}: {line!r} is not NAME  PURPOSE indented under a folder")
        del folders[depth:]
        path = "".join(folders[-1:]) + entry["name"]
        paths[path] = entry["purpose"] or ""
        if path.endswith("/"):
            folders.append(path)
    return paths


def required_paths(root: Path) -> list[str]:
    """Every module the tree must name: each .py file but `__init__.py`, and each file of the script
    folders."""
    required = []
    for folder in MODULE_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            relative = path.relative_to(root)
            hidden = any(part.startswith(".") or part == "__pycache__" for part in relative.parts)
            if hidden or not path.is_file() or path.name == "__init__.py":
                continue
            if path.suffix == ".py" or folder in EVERY_FILE_FOLDERS:
                required.append(relative.as_posix())
    return required


def missing_from_layout(root: Path, page: str) -> list[str]:
    """The modules under `root` that the page's layout tree does not name."""
    listed = layout_paths(layout_block(page))
    return [path for path in required_paths(root) if path not in listed]


def package_folders(root: Path) -> list[str]:
    """The folders the README's tree must name: each module folder, and each package inside `pipeline/`."""
    inner = sorted(
        f"{p.parent.relative_to(root).as_posix()}/" for p in (root / "pipeline").glob("*/__init__.py")
    )
    return [f"{folder}/" for folder in MODULE_FOLDERS] + inner


def _prose_lines(text: str) -> Iterable[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield number, line


def wide_cells(text: str, limit: int = MAX_CELL_CHARS) -> list[tuple[int, int]]:
    """(line number, length) of every markdown table cell longer than `limit` characters."""
    wide = []
    for number, line in _prose_lines(text):
        if not line.lstrip().startswith("|"):
            continue
        lengths = [len(cell.strip()) for cell in _CELL_SPLIT.split(line)]
        wide += [(number, length) for length in lengths if length > limit]
    return wide


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for _, line in _prose_lines(text):
        if match := re.match(r"#{1,6} (.+)", line):
            anchors.add(re.sub(r"[^\w\- ]", "", match[1].strip().lower()).replace(" ", "-"))
    return anchors


def broken_links(path: Path) -> list[str]:
    """Relative links in a markdown file whose target file (or heading anchor) does not exist."""
    text = path.read_text(encoding="utf-8")
    broken = []
    for number, line in _prose_lines(text):
        for match in _LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = match["target"]
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto: and the like are not checked here
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{path.name}:{number}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text()):
                broken.append(f"{path.name}:{number}: {target} (no such heading)")
    return broken


def _markdown_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def test_the_architecture_pages_layout_tree_names_every_module(project_root):
    page = (project_root / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert missing_from_layout(project_root, page) == []


def test_the_readmes_layout_tree_names_every_package(project_root):
    listed = layout_paths(layout_block((project_root / "README.md").read_text(encoding="utf-8")))
    assert [folder for folder in package_folders(project_root) if folder not in listed] == []


@pytest.mark.parametrize("page", ["README.md", "docs/architecture.md"])
def test_every_layout_entry_has_a_purpose(project_root, page):
    paths = layout_paths(layout_block((project_root / page).read_text(encoding="utf-8")))
    assert [path for path, purpose in paths.items() if not purpose] == []


def test_the_checker_reports_a_module_missing_from_the_tree(tmp_path):
    for name in (
        "pipeline/__init__.py",
        "pipeline/config.py",
        "pipeline/data/split.py",
        "pipeline/data/read.py",
        "flows/retrain.py",
        "scripts/gpu_check.sh",
        "pipeline/__pycache__/config.cpython-311.pyc",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    tree = [
        "pipeline/        the library",
        "  config.py      configs",
        "  read.py        listed under the wrong folder: it lives in data/",
        "  data/          rows",
        "    split.py     the split",
        "flows/           Prefect",
        "  retrain.py     the flow",
    ]
    readme = "# x\n\n## Layout\n\n```\n" + "\n".join(tree) + "\n```\n"
    assert missing_from_layout(tmp_path, readme) == ["pipeline/data/read.py", "scripts/gpu_check.sh"]


def test_the_checker_refuses_an_ambiguous_tree():
    with pytest.raises(LayoutError, match="line 2"):
        layout_paths(["pipeline/  the library", "   config.py  three spaces: under what?"])
    with pytest.raises(LayoutError, match="line 2"):
        layout_paths(["README.md  a file", "  config.py  indented under a file"])


def test_readme_stays_short(project_root):
    lines = (project_root / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move reference text to docs/"


def test_no_table_cell_is_a_wall_of_text(project_root):
    wide = {page.name: wide_cells(page.read_text(encoding="utf-8")) for page in _markdown_files(project_root)}
    too_wide = {name: cells for name, cells in wide.items() if cells}  # (line, characters) per file
    assert too_wide == {}, f"table cells over {MAX_CELL_CHARS} characters"


def test_the_checkers_see_wide_cells_and_broken_links(tmp_path):
    assert wide_cells("| a | b |\n|---|---|\n| " + "x" * 401 + " | a \\| b |\n") == [(3, 401)]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# Model quality (2026-12-01)\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/there.md#model-quality-2026-12-01) [web](https://example.org) `[code](nowhere.md)`\n"
        "[gone](docs/gone.md) [bad anchor](docs/there.md#quality)\n"
    )
    assert broken_links(page) == [
        "README.md:2: docs/gone.md (no such file)",
        "README.md:2: docs/there.md#quality (no such heading)",
    ]


def test_relative_links_point_to_existing_files(project_root):
    assert [link for page in _markdown_files(project_root) for link in broken_links(page)] == []
