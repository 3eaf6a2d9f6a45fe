"""The bundled entities and their attribute table: loading, validation, the train/test split.

`data/entities.csv` (name, category, split, aliases) lists the 200 secrets; `data/attributes.csv`
holds one row per entity and one column per attribute, each cell `yes`, `no` or `n/a`. A malformed
row is skipped with a warning that names the file and line: one bad row must not stop a training
run, and the warning says exactly what to fix.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
ENTITIES_CSV = DATA_DIR / "entities.csv"
ATTRIBUTES_CSV = DATA_DIR / "attributes.csv"
CATEGORIES = (
    "animals",
    "celebrities",
    "fictional characters",
    "furniture",
    "electronics",
    "instruments",
    "flowers",
    "stationery",
)
SPLITS = ("train", "test")
UNKNOWN = "n/a"
VALUES = ("yes", "no", UNKNOWN)


class DataError(ValueError):
    """A data file cannot be used at all (missing, or without the required columns)."""


@dataclass(frozen=True)
class Entity:
    """One secret: its name, category, split and the other names that count as guessing it."""

    name: str
    category: str
    split: str
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The name and every alias."""
        return (self.name, *self.aliases)

    def task(self) -> dict[str, str]:
        """The task payload a rollout gets: what the answerer must know (and the category hint)."""
        return {"secret": self.name, "category": self.category}


@dataclass
class EntityTable:
    """The entities with their attributes; entities without a valid attribute row are left out."""

    entities: list[Entity]
    attributes: dict[str, dict[str, str]]
    attribute_names: tuple[str, ...]
    _by_name: dict[str, Entity] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_name = {e.name.lower(): e for e in self.entities}

    def get(self, name: str) -> Entity | None:
        """The entity called `name` (case-insensitive), or None."""
        return self._by_name.get(name.strip().lower())

    def row(self, entity: str) -> dict[str, str]:
        """{attribute: `yes`, `no` or `n/a`} for one entity (empty for an unknown one; a missing attribute
        means `UNKNOWN`)."""
        return self.attributes.get(entity.strip().lower(), {})

    def value(self, entity: str, attribute: str) -> str:
        """`yes`, `no` or `n/a` for one entity and attribute (`n/a` for anything unknown)."""
        return self.row(entity).get(attribute, UNKNOWN)

    def split(self, split: str, category: str | None = None) -> list[Entity]:
        """The entities of one split (optionally of one category), in file order."""
        return [e for e in self.entities if e.split == split and (category is None or e.category == category)]


def _rows(path: Path, required: tuple[str, ...]) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """The header and (line number, row) pairs of a CSV; DataError if it cannot be read at all."""
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as error:
        raise DataError(f"cannot read {path}: {error.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        missing = [c for c in required if c not in header]
        if missing:
            raise DataError(f"{path}: missing column(s) {', '.join(missing)}; the header is {header}")
        rows = [(reader.line_num, row) for row in reader]
    return header, rows


def parse_entity(row: dict[str, str | None], where: str) -> Entity | None:
    """An Entity from one CSV row, or None (with a warning naming `where`) if the row is malformed."""
    if None in row or any(value is None for value in row.values()):
        logger.warning("%s: skipped: the row has %s fields than the header", where, "more" if None in row else "fewer")
        return None
    name = (row.get("name") or "").strip()
    category = (row.get("category") or "").strip()
    split = (row.get("split") or "").strip()
    problem = None
    if not name:
        problem = "empty name"
    elif category not in CATEGORIES:
        problem = f"category {category!r} is not one of {', '.join(CATEGORIES)}"
    elif split not in SPLITS:
        problem = f"split {split!r} is not train or test"
    if problem:
        logger.warning("%s: skipped: %s", where, problem)
        return None
    aliases = tuple(a.strip() for a in (row.get("aliases") or "").split("|") if a.strip())
    return Entity(name, category, split, aliases)


def load_entities(path: str | Path = ENTITIES_CSV) -> list[Entity]:
    """The valid entities of `path`; malformed and duplicate rows are skipped with a warning."""
    path = Path(path)
    _, rows = _rows(path, ("name", "category", "split"))
    entities: list[Entity] = []
    seen: set[str] = set()
    for line, row in rows:
        entity = parse_entity(row, f"{path.name}:{line}")
        if entity is None:
            continue
        if entity.name.lower() in seen:
            logger.warning("%s:%d: skipped: %r appears twice", path.name, line, entity.name)
            continue
        seen.add(entity.name.lower())
        entities.append(entity)
    return entities


def load_attributes(path: str | Path = ATTRIBUTES_CSV) -> tuple[tuple[str, ...], dict[str, dict[str, str]]]:
    """(attribute names, {entity name lowercased: {attribute: yes|no|n/a}}); bad rows skipped with a warning."""
    path = Path(path)
    header, rows = _rows(path, ("name",))
    names = tuple(c for c in header if c != "name")
    table: dict[str, dict[str, str]] = {}
    for line, row in rows:
        where = f"{path.name}:{line}"
        if None in row or any(value is None for value in row.values()):
            logger.warning("%s: skipped: the row does not have one value per column", where)
            continue
        entity = (row.get("name") or "").strip()
        bad = sorted(a for a in names if (row[a] or "").strip() not in VALUES)
        if not entity or bad:
            logger.warning(
                "%s: skipped: %s",
                where,
                "empty name" if not entity else f"{bad[0]}={row[bad[0]]!r} is not yes, no or n/a",
            )
            continue
        table[entity.lower()] = {a: row[a].strip() for a in names}
    return names, table


def load_table(entities_csv: str | Path = ENTITIES_CSV, attributes_csv: str | Path = ATTRIBUTES_CSV) -> EntityTable:
    """Entities joined with their attributes; an entity without an attribute row is skipped with a warning."""
    names, attributes = load_attributes(attributes_csv)
    entities = []
    for entity in load_entities(entities_csv):
        if entity.name.lower() not in attributes:
            logger.warning(
                "%s: skipped %r: no row in %s", Path(entities_csv).name, entity.name, Path(attributes_csv).name
            )
            continue
        entities.append(entity)
    return EntityTable(entities, attributes, names)


_DEFAULT: EntityTable | None = None


def default_table() -> EntityTable:
    """The bundled table, loaded once per process."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = load_table()
    return _DEFAULT


def tasks_for(split: str, table: EntityTable | None = None) -> list[dict[str, str]]:
    """The task payloads of one split ({"secret", "category"} per entity)."""
    return [entity.task() for entity in (table or default_table()).split(split)]
