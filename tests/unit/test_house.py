"""The house keeps the shape its last clean-up gave it (`scripts/house_figures.py` measures it): no flow
module reaches into the command line, every class of the project is built with its fields named past six
arguments, and `# fmt: skip` stays on the few lines a formatter really harms."""

import pytest

from scripts.house_figures import FMT_SKIP, MAX_POSITIONAL, measure, positional_calls

MAX_FMT_SKIP_LINES = 300
"""In pipeline/ and flows/: hand-packed code a formatter may no longer touch is the exception."""


@pytest.fixture(scope="module")
def figures():
    """The house's figures, measured once for the module: each measurement parses every file (seconds)."""
    return measure()


def test_no_flow_module_imports_the_command_line(figures):
    assert figures.flows_importing_cli == []


def test_no_class_of_the_project_is_built_with_more_than_six_positional_arguments(figures):
    assert figures.positional_calls == []


def test_the_checker_sees_a_class_built_by_position(tmp_path, monkeypatch):
    import scripts.house_figures as figures

    (tmp_path / "module.py").write_text(
        "class Row:\n    pass\n\nRow(1, 2, 3, 4, 5, 6)\nRow(1, 2, 3, 4, 5, 6, 7)\nRow(*values, a=1)\n"
    )
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    assert positional_calls([tmp_path / "module.py"], {"Row"}) == [
        f"module.py:5 Row({MAX_POSITIONAL + 1} positional)"
    ]


def test_fmt_skip_stays_rare_in_the_library(figures):
    assert figures.fmt_skip_library <= MAX_FMT_SKIP_LINES, f"lines holding {FMT_SKIP!r}"
