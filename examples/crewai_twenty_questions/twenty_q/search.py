"""The player's optional search tool: an offline encyclopedia over the bundled attribute table.

It answers "what is true of X?" for a thing the query names, never "what is the secret?", so it
helps a player that reasons ("do penguins fly?") without leaking the answer. Each use is counted in
the game state (`tool_calls`).
"""

from __future__ import annotations

from crewai.tools import BaseTool
from pydantic import BaseModel, Field, PrivateAttr

from twenty_q.data import EntityTable, default_table
from twenty_q.lexicon import normalize


class SearchInput(BaseModel):
    """The tool's argument."""

    query: str = Field(description="What to look up, naming the thing, e.g. 'penguin' or 'does a harp have strings'.")


class EncyclopediaSearchTool(BaseTool):
    """Looks a named thing up and lists what is true of it."""

    name: str = "search"
    description: str = "Look up facts about a named thing (an animal, a person, an object, a flower...)."
    args_schema: type[BaseModel] = SearchInput
    calls: int = 0
    _table: EntityTable = PrivateAttr(default_factory=default_table)

    def _run(self, query: str) -> str:
        """The facts about the longest bundled name the query mentions, or a 'nothing found' line."""
        self.calls += 1
        text = f" {normalize(str(query))} "
        best = None
        for entity in self._table.entities:
            for name in entity.names:
                key = normalize(name)
                if key and f" {key} " in text and (best is None or len(key) > len(best[0])):
                    best = (key, entity)
        if best is None:
            return "No entry found. Search for a specific named thing."
        entity = best[1]
        facts = [a.replace("_", " ") for a in self._table.attribute_names if self._table.value(entity.name, a) == "yes"]
        return f"{entity.name} ({entity.category}): {', '.join(facts)}."
