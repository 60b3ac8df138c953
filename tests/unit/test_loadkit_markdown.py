"""loadkit.markdown: a rerun replaces only the generated part of a report; what people wrote is kept."""

from __future__ import annotations

from pathlib import Path

from loadkit.markdown import HeadSection, MarkedSection, write_section

END = "<!-- gen:end -->"
BEGIN = "<!-- gen:begin -->"


def test_head_section_replaces_everything_above_the_marker_and_keeps_the_rest(tmp_path: Path):
    path = tmp_path / "doc.md"
    layout = HeadSection(END)
    write_section(path, layout, "# Report\n\nfirst run\n")
    assert path.read_text() == f"# Report\n\nfirst run\n\n{END}\n"
    path.write_text(path.read_text() + "\n## Targets\n\nwritten by hand\n")

    write_section(path, layout, "# Report\n\nsecond run\n")
    assert path.read_text() == f"# Report\n\nsecond run\n\n{END}\n\n## Targets\n\nwritten by hand\n"


def test_head_section_without_its_marker_takes_the_whole_file(tmp_path: Path):
    path = tmp_path / "doc.md"
    path.write_text("an old report without a marker\n")
    write_section(path, HeadSection(END), "new")
    assert path.read_text() == f"new\n{END}\n"


def test_marked_section_replaces_only_between_its_markers(tmp_path: Path):
    path = tmp_path / "sub" / "doc.md"
    layout = MarkedSection(BEGIN, END, header="# Intro\n\n")
    write_section(path, layout, "run 1")
    assert path.read_text() == f"# Intro\n\n{BEGIN}\nrun 1\n{END}\n"
    path.write_text(path.read_text().replace("# Intro", "# Intro, edited") + "\nNotes below.\n")

    write_section(path, layout, "run 2")
    assert path.read_text() == f"# Intro, edited\n\n{BEGIN}\nrun 2\n{END}\n\nNotes below.\n"


def test_marked_section_is_appended_to_a_file_without_markers(tmp_path: Path):
    path = tmp_path / "doc.md"
    path.write_text("# Somebody's doc\n\n")
    write_section(path, MarkedSection(BEGIN, END), "run")
    assert path.read_text() == f"# Somebody's doc\n\n{BEGIN}\nrun\n{END}\n"
