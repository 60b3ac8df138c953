"""A generated section of a Markdown file, rewritten by each run while what people wrote around it is kept.

Owns the two layouts the reports use:
- a head section: everything above an end marker is generated; text below the marker is kept
  (docs/benchmarks.md: the report on top, targets and notes below);
- a marked section: the text between a begin and an end marker is generated; text before and after is kept
  (docs/overload.md: a hand-written introduction, then the latest run).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HeadSection:
    """Generated from the top of the file down to `end` (a marker line, written as the section's last line)."""

    end: str

    def merge(self, old: str | None, section: str) -> str:
        kept = old.split(self.end, 1)[1] if old and self.end in old else ""
        return section + "\n" + self.end + (kept or "\n")


@dataclass(frozen=True)
class MarkedSection:
    """Generated between the `begin` and `end` marker lines; a file without them gets the section appended,
    a new file gets `header` (its introduction) and the section."""

    begin: str
    end: str
    header: str = ""

    def merge(self, old: str | None, section: str) -> str:
        block = f"{self.begin}\n{section}\n{self.end}\n"
        if old is None:
            return self.header + block
        if self.begin in old and self.end in old:
            head, rest = old.split(self.begin, 1)
            tail = rest.split(self.end, 1)[1].lstrip("\n")
            return head + block + ("\n" + tail if tail else "")
        return old.rstrip("\n") + "\n\n" + block


def write_section(path: Path, layout: HeadSection | MarkedSection, section: str) -> Path:
    """Rewrites `path`'s generated part with `section`, keeping the rest (creating the file and its folder)."""
    path = Path(path)
    old = path.read_text() if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(layout.merge(old, section))
    return path
