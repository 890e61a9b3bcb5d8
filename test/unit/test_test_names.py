"""pytest imports each test file by its base name (no packages under test/), so two test files of
one name in different folders stop the whole collection ("import file mismatch")."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_name_is_unique():
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
