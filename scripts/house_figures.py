"""The house's figures, measured from the source: what issue 51 tracks as the code grows.

    python scripts/house_figures.py            # a table
    python scripts/house_figures.py --json     # one JSON object

Counted over `pipeline/` and `flows/` (the library and its flows) unless a row says otherwise: modules and
lines, the longest functions, calls that build one of the project's classes with more than 6 positional
arguments, formatter-skip lines and lines longer than the formatter's 110 characters (also over tests/,
benchmarks/ and scripts/), the app factory's length, and the flow modules that import `pipeline.cli`.
"""

from __future__ import annotations

import argparse
import ast
import json
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("pipeline", "flows")
EVERYWHERE = ("pipeline", "flows", "tests", "benchmarks", "scripts")
MAX_POSITIONAL = 6
LINE_LENGTH = 110
FMT_SKIP = "# fmt: " + "skip"  # spelt in two so this file does not count itself


@dataclass(frozen=True)
class Figures:
    modules: int
    lines: int
    longest_functions: list[str]
    positional_calls: list[str]
    fmt_skip_library: int
    fmt_skip_everywhere: int
    long_lines_library: int
    long_lines_everywhere: int
    create_app_lines: int | None
    flows_importing_cli: list[str]


def python_files(folders: tuple[str, ...]) -> list[Path]:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


def functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]


def project_classes(files: list[Path]) -> set[str]:
    """Names of the classes the project defines (tests' own classes left out)."""
    return {
        node.name
        for path in files
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }


def called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def positional_calls(files: list[Path], classes: set[str]) -> list[str]:
    """`file:line Class(n positional)` for every call building a project class with too many positional
    args."""
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and called_name(node) in classes:
                positional = [arg for arg in node.args if not isinstance(arg, ast.Starred)]
                if len(positional) > MAX_POSITIONAL:
                    where = path.relative_to(ROOT)
                    found.append(f"{where}:{node.lineno} {called_name(node)}({len(positional)} positional)")
    return found


def longest_functions(files: list[Path], top: int = 5) -> list[str]:
    sized = []
    for path in files:
        for node in functions(ast.parse(path.read_text())):
            sized.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.name}"))
    return [f"{name} ({lines} lines)" for lines, name in sorted(sized, reverse=True)[:top]]


def count_lines(files: list[Path], test) -> int:
    return sum(1 for path in files for line in path.read_text().splitlines() if test(line))


def create_app_lines() -> int | None:
    for path in python_files(("pipeline",)):
        for node in functions(ast.parse(path.read_text())):
            if node.name == "create_app":
                return node.end_lineno - node.lineno + 1
    return None


def flows_importing_cli() -> list[str]:
    importing = []
    for path in python_files(("flows",)):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if any(name.startswith("pipeline.cli") for name in names):
                importing.append(str(path.relative_to(ROOT)))
                break
    return importing


def measure() -> Figures:
    library, everywhere = python_files(LIBRARY), python_files(EVERYWHERE)
    skip = lambda line: FMT_SKIP in line  # noqa: E731
    long = lambda line: len(line) > LINE_LENGTH  # noqa: E731
    return Figures(
        modules=len(library),
        lines=sum(len(path.read_text().splitlines()) for path in library),
        longest_functions=longest_functions(library),
        positional_calls=positional_calls(everywhere, project_classes(library)),
        fmt_skip_library=count_lines(library, skip),
        fmt_skip_everywhere=count_lines(everywhere, skip),
        long_lines_library=count_lines(library, long),
        long_lines_everywhere=count_lines(everywhere, long),
        create_app_lines=create_app_lines(),
        flows_importing_cli=flows_importing_cli(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    figures = measure()
    if parser.parse_args().json:
        print(json.dumps(asdict(figures), indent=2))
        return
    print(f"modules (pipeline, flows): {figures.modules}, {figures.lines:,} lines")
    print("longest functions: " + "; ".join(figures.longest_functions))
    print(
        f"calls building a project class with > {MAX_POSITIONAL} positional arguments: "
        f"{len(figures.positional_calls)}"
    )
    for call in figures.positional_calls:
        print(f"  {call}")
    print(
        f"`# fmt: skip` lines: {figures.fmt_skip_library} in pipeline and flows, "
        f"{figures.fmt_skip_everywhere} with tests, benchmarks and scripts"
    )
    print(
        f"lines over {LINE_LENGTH} characters: {figures.long_lines_library} in pipeline and flows, "
        f"{figures.long_lines_everywhere} everywhere"
    )
    print(f"create_app: {figures.create_app_lines} lines")
    print(
        f"flow modules importing pipeline.cli: {len(figures.flows_importing_cli)} "
        f"({', '.join(figures.flows_importing_cli) or 'none'})"
    )


if __name__ == "__main__":
    main()
