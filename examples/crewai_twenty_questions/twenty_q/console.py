"""Silencing CrewAI's console renderer, which games run by the dozen cannot afford.

CrewAI's global event listener draws every flow, crew and agent as a live-updating rich tree from
its event-handler threads. With many concurrent games (and stdout a pipe) that rendering dominates
the run time and, in CrewAI 1.6.1, can stall a flow at its end while handler threads queue on the
live display. The events themselves still fire (and agentops still traces them); only the drawing
goes to a quiet console.

CrewAI 1.6.1's task-started handler waits up to 5 s for the formatter's crew tree, which a non-verbose
formatter never makes: every answerer task (one Crew per question) held one of the event bus's 10
handler threads for 5 s, and the bus's queue slowed every game to about 3 s. A placeholder tree ends
the wait; a non-verbose formatter never draws into it.
"""

from __future__ import annotations

from rich.console import Console
from rich.tree import Tree


def quiet_crewai_console() -> None:
    """Turn CrewAI's event rendering off: a quiet console, and no live trees. Idempotent.

    The formatter's `print` opens a rich Live display per tree, and rich allows one at a time: with
    concurrent flows every other handler fails ("Only one live display may be active at once").
    """
    from crewai.events.event_listener import event_listener

    formatter = event_listener.formatter
    formatter.verbose = False
    if not getattr(formatter.console, "quiet", False):
        formatter.console = Console(quiet=True)
    formatter.print = lambda *args, **kwargs: None  # type: ignore[method-assign]
    if formatter.current_crew_tree is None:
        formatter.current_crew_tree = Tree("crewai events (not drawn)")
