"""The bundled Twenty Questions data: 200 real entities, the split, the attribute table, bad rows."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest
import twenty_questions_helpers  # noqa: F401  (puts the example on the import path)
from twenty_q.data import CATEGORIES, DataError, load_attributes, load_entities, load_table
from twenty_q.lexicon import attribute_names


def test_two_hundred_entities_in_eight_categories_split_80_20() -> None:
    table = load_table()
    assert len(table.entities) == 200
    counts = Counter((e.category, e.split) for e in table.entities)
    for category in CATEGORIES:
        assert counts[(category, "train")] == 20 and counts[(category, "test")] == 5, category
    assert len({e.name.lower() for e in table.entities}) == 200


def test_every_entity_has_a_complete_attribute_row_and_the_lexicon_uses_real_columns() -> None:
    table = load_table()
    for entity in table.entities:
        row = table.attributes[entity.name.lower()]
        assert set(row.values()) <= {"yes", "no", "n/a"}
    assert attribute_names() <= set(table.attribute_names), attribute_names() - set(table.attribute_names)


def test_no_alias_names_two_entities() -> None:
    names = Counter(n.lower() for e in load_table().entities for n in e.names)
    assert [n for n, c in names.items() if c > 1] == []


def test_malformed_entity_rows_are_skipped_with_the_line_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "entities.csv"
    path.write_text(
        "name,category,split,aliases\n"
        "dog,animals,train,puppy\n"
        ",animals,train,\n"  # line 3: empty name
        "cat,pets,train,\n"  # line 4: unknown category
        "cow,animals,validation,\n"  # line 5: unknown split
        "dog,animals,test,\n"  # line 6: duplicate
        "rose,flowers,test,roses,extra\n"  # line 7: too many fields
        "tulip,flowers,test\n"  # line 8: fine without aliases (DictReader gives None)
    )
    with caplog.at_level(logging.WARNING):
        entities = load_entities(path)
    assert [e.name for e in entities] == ["dog"]
    text = caplog.text
    for line in (3, 4, 5, 6, 7, 8):
        assert f"entities.csv:{line}" in text, line


def test_malformed_attribute_rows_are_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "attributes.csv"
    path.write_text("name,animal,red\ndog,yes,no\ncat,maybe,no\nrose,no\n")
    with caplog.at_level(logging.WARNING):
        names, table = load_attributes(path)
    assert names == ("animal", "red") and list(table) == ["dog"]
    assert "attributes.csv:3" in caplog.text and "maybe" in caplog.text and "attributes.csv:4" in caplog.text


def test_a_missing_file_or_column_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read"):
        load_entities(tmp_path / "nope.csv")
    (tmp_path / "bad.csv").write_text("title,category\nx,animals\n")
    with pytest.raises(DataError, match="missing column"):
        load_entities(tmp_path / "bad.csv")


def test_the_shipped_csvs_are_what_the_generator_writes(tmp_path: Path) -> None:
    import importlib.util

    from twenty_questions_helpers import EXAMPLE

    spec = importlib.util.spec_from_file_location("twenty_q_build_data", EXAMPLE / "data" / "build_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    for name in ("entities.csv", "attributes.csv"):
        assert (tmp_path / name).read_text() == (EXAMPLE / "data" / name).read_text(), name
