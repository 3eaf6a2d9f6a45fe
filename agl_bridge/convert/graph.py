"""The rollout graph: every token call of an attempt gets a class (`CallClass`) and a parent call.

Why: an agent's attempt holds more than the conversation that earned the reward. Title generators
and probes (side calls), requests the client sent again (retries), summaries that replace the
history (compactions) and sub-agents' own conversations are recorded like any turn; training all of
them with the rollout's advantage credits tokens that did not earn it. `build_graph` decides what
each call was from the recorded token structure alone (never from known agents' prompt strings),
as a pure function of the attempt's calls. The converter (`convert_attempt`) then trains only the
classes `ConvertOptions.train_classes` names; inspect and the viewer show the same graph.

Terms. P(c) is a call's prompt ids, R(c) its sampled ids. A later request *carries* `c`'s answer
when the proxy found its text inside a message of another role (`LLMCall.carries`: a summary sent
as a user message, a sub-agent's answer as a tool result; text survives the answer being tokenized
anew, sampled ids rarely do), or when R(c), less its stop token, appears in its prompt. A chat
prompt ends with the template's generation prompt, so a later prompt that starts with all of P(p)
goes on with an assistant message there. `c` *continues* `p` when P(c) starts with P(p) + R(p)
(the merge rule), or, failing that, with all of P(p) (p's reply re-rendered by the template or
edited by the agent). A *tree* is a call with everything that continues it, transitively; a *lone*
call is a tree of one.

The rules, in order (docs/trajectories.md, "What trains", has the picture):
  1. **Declared** — a class sent with the request (`x-agl-call-class`) wins; a declared parent
     (`x-agl-parent-call`) that names an earlier call of the attempt is that call's parent edge
     (an unknown or later one is warned about and the parent inferred).
  2. **Continuation** — each call's parent is the latest earlier call it continues; failing that,
     for a call whose record names a prefix break (the proxy saw it re-send a reply of ours that
     the template re-rendered), the earlier call whose prompt shares the most leading tokens.
  3. **retry** — a call nothing continues and whose answer no later request carries, when a later
     request sent its exact prompt again (the client asked again), or when a sibling — a call
     continuing the same parent — was continued or carried instead (the agent asked twice from one
     point and went on from the other answer).
  4. **main** — the tree of the latest call whose tree has more than one call; when every tree is
     one call, the largest group of calls sharing history (ties: the longer prompt, then the later),
     so a late or lone title call never becomes the conversation. Every other tree whose first
     prompt shares its first `SHARED_HISTORY_TOKENS` tokens with it is the same conversation
     rendered afresh (as DSPy does each turn) and main too, unless rule 5 makes it a compaction.
  5. **compaction** — a *restart* is a call of the main conversation that continues nothing and
     whose prompt is shorter than the longest main prompt + response since the previous restart:
     the history was replaced. Of the calls since then that nothing continued, the last whose
     answer the restart's prompt carries, else
     the last one, is the compaction (even when it continued the main conversation, as a
     "summarize the above" turn does); the restart's parent edge is the compaction.
  6. **subagent** — a tree outside the main conversation of more than one call, or whose first
     call declared its parent, or a lone call whose answer is carried into a later call that
     continues a conversation (a tool result): a conversation of its own whose result returns. Its
     parent edge is the main call made before it (the one that spawned it).
  7. **side** — any other lone call: never continued, sharing no history, its answer used nowhere.

Choices k > 0 of an n-choice request take the class and parent of their request's first choice.
Calls without token ids (kind "text") are not in the graph (they never train).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from agl_bridge import semconv
from agl_bridge.types import CallClass, LLMCall

CallKey = tuple[int, int]
"""(sequence, choice_index) of a call."""

SHARED_HISTORY_TOKENS = 32
"""Leading prompt tokens two trees must share to be one conversation (a system prompt's worth).

Two unrelated prompts of one chat template share only the template's few opening tokens
(`<|im_start|>system\\n` is 3); a re-rendered conversation shares its whole system prompt."""

MIN_CARRIED_TOKENS = 4
"""Sampled tokens (stop token excluded) an answer needs before finding it in a later prompt counts
as evidence that the answer was carried there: shorter runs recur by chance."""

MAX_WARNINGS = 20
"""Warnings kept per graph; the rest are counted in `RolloutGraph.warnings_dropped`."""


@dataclass(frozen=True, slots=True)
class CallNode:
    """What one call was: its class, its parent call (None for a root), why, and whether it was declared."""

    call_class: CallClass
    parent: CallKey | None
    reason: str
    declared: bool = False


@dataclass(slots=True)
class RolloutGraph:
    """Every token call of one attempt with its `CallNode`, and the warnings building it raised."""

    nodes: dict[CallKey, CallNode] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    warnings_dropped: int = 0
    one_conversation: bool = False
    """True when every call continued the one before, one request at a time (all main): merging
    then needs no token check (`merge_calls` uses it)."""

    def class_of(self, call: LLMCall) -> CallClass | None:
        """The class of `call` (None for a call outside the graph: text-only, or not of this attempt)."""
        node = self.nodes.get((call.sequence, call.choice_index))  # type: ignore[arg-type]
        return None if node is None else node.call_class

    def counts(self) -> dict[str, int]:
        """Calls per class, in `CALL_CLASSES` order (classes with no call left out)."""
        counted = dict.fromkeys(semconv.CALL_CLASSES, 0)
        for node in self.nodes.values():
            counted[node.call_class.value] += 1
        return {name: n for name, n in counted.items() if n}

    def warn(self, message: str) -> None:
        """Keep `message` (up to MAX_WARNINGS; the rest are counted)."""
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(message)
        else:
            self.warnings_dropped += 1


class _Call:
    """One call of the graph while it is built (index order = (sequence, choice) order)."""

    __slots__ = ("call", "carried_probe", "choice", "key", "parent", "prompt", "response", "sequence", "tree", "via")

    def __init__(self, call: LLMCall) -> None:
        self.call = call
        self.sequence: int = call.sequence  # type: ignore[assignment]  # stored calls always have one
        self.choice = call.choice_index
        self.key: CallKey = (self.sequence, self.choice)
        self.prompt: array[int] = _ids(call.prompt_token_ids)
        self.response: array[int] = _ids(call.response_token_ids)
        self.parent: _Call | None = None
        self.via = ""  # how the parent edge was found: "tokens", "resent", "break", "declared"
        # The sequence of its tree's root, once trees are known (a number, not the node: a node
        # pointing at itself would be a reference cycle keeping the stored calls alive until a GC).
        self.tree = self.sequence
        self.carried_probe: bytes | None = None

    def continued_by(self, prompt: array[int]) -> bool:
        """Whether `prompt` starts with this call's prompt + response."""
        n_prompt, n_response = len(self.prompt), len(self.response)
        n = n_prompt + n_response
        if len(prompt) < n or (n and prompt[n - 1] != (self.response[-1] if n_response else self.prompt[-1])):
            return False
        return prompt[:n_prompt] == self.prompt and prompt[n_prompt:n] == self.response

    def answer_probe(self) -> bytes | None:
        """This call's answer (stop token dropped) as bytes to search prompts for; None if too short."""
        if self.carried_probe is None:
            core = self.response[:-1] if self.call.finish_reason != "length" else self.response
            self.carried_probe = core.tobytes() if len(core) >= MIN_CARRIED_TOKENS else b""
        return self.carried_probe or None


def build_graph(calls: Sequence[LLMCall]) -> RolloutGraph:
    """The graph of one attempt's calls (any order; each needs its store `sequence`). See the module doc."""
    graph = RolloutGraph()
    token_calls = sorted(_token_calls(calls), key=_order)
    if _one_conversation(token_calls, graph):
        return graph
    ordered = [_Call(call) for call in token_calls]
    by_key = {node.key: node for node in ordered}
    first_choice = _link_parents(ordered, by_key, graph)
    retries = _find_retries(ordered, first_choice)
    classes, reasons, edges = _classify_trees(ordered, retries, first_choice)
    for node in ordered:
        head = first_choice[node.sequence]
        call_class, reason = classes[head.key], reasons[head.key]
        parent = edges.get(head.key) or head.parent
        declared = node.call.declared_class
        if declared is not None:
            call_class, reason = declared, f"declared {declared.value} by the request ({semconv.HEADER_CALL_CLASS})"
        graph.nodes[node.key] = CallNode(
            call_class=call_class,
            parent=None if parent is None else parent.key,
            reason=reason if node is head else f"{reason} (choice {node.choice} of the request at {node.sequence})",
            declared=declared is not None,
        )
    _check_main_leaves(ordered, graph)
    return graph


_ONE_CONVERSATION = "main: the conversation that ends the attempt"


def _one_conversation(calls: list[LLMCall], graph: RolloutGraph) -> bool:
    """The common case, fast: one request at a time, nothing declared, each continuing the one before.

    Every call is then main, the parent of the next; nothing else can apply. Fills `graph` and
    returns True, or returns False (graph untouched) for the general rules.
    """
    previous: LLMCall | None = None
    for call in calls:
        if call.declared_class is not None or call.declared_parent is not None or call.choice_index:
            return False
        if previous is not None:
            head, tail = previous.prompt_token_ids, previous.response_token_ids
            prompt = call.prompt_token_ids
            n_head = len(head)
            n = n_head + len(tail)
            if previous.sequence == call.sequence or len(prompt) < n:
                return False
            if not (prompt[:n_head] == head and prompt[n_head:n] == tail):
                return False
        previous = call
    parent: CallKey | None = None
    for call in calls:
        key: CallKey = (call.sequence, 0)  # type: ignore[assignment]  # stored calls have sequences
        graph.nodes[key] = CallNode(call_class=CallClass.MAIN, parent=parent, reason=_ONE_CONVERSATION)
        parent = key
    graph.one_conversation = True
    return True


def label_calls(calls: Sequence[LLMCall]) -> dict[CallKey, tuple[str, int | None, str]]:
    """Each call's class name, parent sequence and reason, by (sequence, choice): what `inspect` shows."""
    graph = build_graph(calls)
    labels = {
        key: (node.call_class.value, None if node.parent is None else node.parent[0], node.reason)
        for key, node in graph.nodes.items()
    }
    for warning in graph.warnings:
        for key, (name, parent, reason) in labels.items():
            if f"sequence {key[0]} " in warning:
                labels[key] = (name, parent, f"{reason}; warning: {warning}")
    return labels


def _token_calls(calls: Sequence[LLMCall]) -> list[LLMCall]:
    return [call for call in calls if call.kind == semconv.CALL_KIND_TOKEN]


def _order(call: LLMCall) -> tuple[int, int]:
    return (call.sequence, call.choice_index)  # type: ignore[return-value]  # stored calls have sequences


def _ids(ids: Sequence[int]) -> array[int]:
    return ids if isinstance(ids, array) and ids.typecode == "i" else array("i", ids)


def _link_parents(ordered: list[_Call], by_key: dict[CallKey, _Call], graph: RolloutGraph) -> dict[int, _Call]:
    """Rules 1-2: each call's parent edge. Returns the first choice of each request by sequence."""
    first_choice: dict[int, _Call] = {}
    for index, node in enumerate(ordered):
        head = first_choice.setdefault(node.sequence, node)
        if head is not node:  # choice k > 0: same prompt, same parent as its request's first choice
            node.parent, node.via = head.parent, head.via
            continue
        declared = _declared_parent(node, by_key, graph)
        if declared is not None:
            node.parent, node.via = declared, "declared"
            continue
        earlier_calls = ordered[:index]
        for earlier in reversed(earlier_calls):
            if earlier.continued_by(node.prompt):
                node.parent, node.via = earlier, "tokens"
                break
        else:
            for earlier in reversed(earlier_calls):
                if earlier.choice == 0 and _strict_prefix(earlier.prompt, node.prompt):
                    node.parent, node.via = earlier, "resent"
                    break
            else:
                if node.call.prefix_breaks:
                    node.parent = _closest_earlier(node, earlier_calls)
                    node.via = "break" if node.parent is not None else ""
    return first_choice


def _closest_earlier(node: _Call, earlier_calls: list[_Call]) -> _Call | None:
    """The earlier request whose prompt shares the most leading tokens with `node`'s (ties: the later).

    For a call whose record names a prefix break: the proxy saw it re-send a reply of ours that the
    template rendered differently (a template that is not prefix-stable re-renders earlier turns
    too), so it continues that conversation even though no token check can say so.
    """
    best: _Call | None = None
    best_shared = 0
    for earlier in earlier_calls:
        if earlier.choice:
            continue
        shared = _common_prefix(earlier.prompt, node.prompt)
        if shared and shared >= best_shared:
            best, best_shared = earlier, shared
    return best


def _declared_parent(node: _Call, by_key: dict[CallKey, _Call], graph: RolloutGraph) -> _Call | None:
    """The earlier call the request declared as its parent; an unknown or later one is warned about."""
    declared = node.call.declared_parent
    if declared is None:
        return None
    where = f"the call at sequence {node.sequence}"
    sequence = int(declared) if declared.isdigit() else None
    parent = None if sequence is None else by_key.get((sequence, 0))
    if parent is None:
        graph.warn(
            f"{where} declared parent {declared[:80]!r}, which is no call of this attempt; "
            "recorded as an unknown parent, the parent is inferred instead"
        )
        return None
    if parent.sequence >= node.sequence:
        graph.warn(
            f"{where} declared parent sequence {parent.sequence}, which is not an earlier call (a parent must "
            "come first; following it could make a cycle); the parent is inferred instead"
        )
        return None
    return parent


def _strict_prefix(prompt: array[int], longer: array[int]) -> bool:
    """Whether `longer` is `prompt` followed by more tokens.

    A chat prompt ends with the template's generation prompt (`<|im_start|>assistant\\n`), so a
    later prompt that starts with all of it goes on with an assistant message there: the earlier
    call's reply, re-rendered by the template (Qwen3 drops `<think>` blocks) or edited by the agent.
    """
    n = len(prompt)
    return len(longer) > n and longer[n - 1] == prompt[-1] and longer[:n] == prompt


def _find_retries(ordered: list[_Call], first_choice: dict[int, _Call]) -> set[int]:
    """Rule 3: sequences of the requests whose answer was thrown away (see the module doc)."""
    parents_of = {node.parent.sequence for node in ordered if node.parent is not None}
    carried = {sequence for node in ordered for sequence in node.call.carries}
    kept = parents_of | carried  # answers something went on from
    heads = list(first_choice.values())
    siblings: dict[int, list[_Call]] = {}
    for head in heads:
        if head.parent is not None and head.via != "declared":
            siblings.setdefault(head.parent.sequence, []).append(head)
    retries: set[int] = set()
    for position, head in enumerate(heads):
        if head.sequence in kept:
            continue
        prompt, n = head.prompt, len(head.prompt)
        for later in heads[position + 1 :]:
            if len(later.prompt) == n and later.prompt[-1] == prompt[-1] and later.prompt == prompt:
                retries.add(head.sequence)
                break
        else:
            if head.parent is not None and any(
                other is not head and other.sequence in kept for other in siblings.get(head.parent.sequence, ())
            ):
                retries.add(head.sequence)
    return retries


def _classify_trees(
    ordered: list[_Call], retries: set[int], first_choice: dict[int, _Call]
) -> tuple[dict[CallKey, CallClass], dict[CallKey, str], dict[CallKey, _Call]]:
    """Rules 3-7 for each request's first choice: its class, the reason, and the edges rules 5-6 add."""
    classes: dict[CallKey, CallClass] = {}
    reasons: dict[CallKey, str] = {}
    for sequence in retries:
        classes[first_choice[sequence].key] = CallClass.RETRY
        reasons[first_choice[sequence].key] = (
            "retry: nothing continued its answer and a later request sent its exact prompt again (a discarded branch)"
        )
    heads = [head for head in first_choice.values() if head.sequence not in retries]
    if not heads:
        return classes, reasons, {}
    trees: dict[int, list[_Call]] = {}
    for head in heads:
        root = head
        while root.parent is not None and root.via != "declared":  # a declared parent spawns, it is not continued
            root = root.parent
        head.tree = root.sequence
        trees.setdefault(root.sequence, []).append(head)
    main_root = _main_root(heads, trees)
    main_trees = {
        root_sequence
        for root_sequence, members in trees.items()
        if root_sequence == main_root.sequence or _shares_history(members[0].prompt, main_root.prompt)
    }
    edges, compactions = _compactions(heads, trees, main_root)
    for root_sequence, members in trees.items():
        if root_sequence == main_root.sequence:
            call_class, reason = CallClass.MAIN, "main: the conversation that ends the attempt"
        elif root_sequence in main_trees:
            call_class = CallClass.MAIN
            reason = "main: the main conversation rendered afresh (its first prompt shares the main prompt's history)"
        else:
            call_class, reason = _outside_main(members, heads)
            if call_class is CallClass.SUBAGENT and members[0].via != "declared":
                spawner = _last_main_before(members[0], heads, main_trees)
                if spawner is not None:
                    edges[members[0].key] = spawner
        for head in members:
            if head.sequence in compactions:
                classes[head.key], reasons[head.key] = CallClass.COMPACTION, compactions[head.sequence]
            else:
                classes[head.key], reasons[head.key] = call_class, reason
    return classes, reasons, edges


def _main_root(heads: list[_Call], trees: dict[int, list[_Call]]) -> _Call:
    """Rule 4: the root of the main conversation.

    The tree of the latest call whose tree has more than one call; when every tree is one call,
    the calls that share history form conversations and the largest wins (ties: the longer last
    prompt, then the later), so a late or lone title call never becomes the conversation. Trees
    spawned by a declared parent are passed over while any other tree exists.
    """
    spawned = {sequence for sequence, members in trees.items() if members[0].via == "declared"}
    candidates = [head for head in heads if head.tree not in spawned] or heads
    for head in reversed(candidates):
        if len(trees[head.tree]) > 1:
            return trees[head.tree][0]
    groups: list[list[_Call]] = []
    for head in candidates:
        group = next((group for group in groups if _shares_history(group[0].prompt, head.prompt)), None)
        if group is None:
            groups.append([head])
        else:
            group.append(head)
    best = max(groups, key=lambda group: (len(group), len(group[-1].prompt), group[-1].sequence))
    return trees[best[-1].tree][0]


def _shares_history(prompt: array[int], other: array[int]) -> bool:
    n = SHARED_HISTORY_TOKENS
    return len(prompt) >= n and len(other) >= n and prompt[:n] == other[:n]


def _compactions(
    heads: list[_Call], trees: dict[int, list[_Call]], main_root: _Call
) -> tuple[dict[CallKey, _Call], dict[int, str]]:
    """Rule 5: the calls whose answer replaced the main history (by sequence), and each restart's parent edge."""
    edges: dict[CallKey, _Call] = {}
    compactions: dict[int, str] = {}
    continued = {head.parent.sequence for head in heads if head.parent is not None}
    history: _Call | None = None  # the longest main prompt + response since the last restart
    leaves: list[_Call] = []  # calls since the last restart that nothing continued
    for head in heads:
        root = trees[head.tree][0]
        in_main = root is main_root or _shares_history(root.prompt, main_root.prompt)
        if not in_main and len(trees[root.sequence]) > 1:
            continue  # a conversation of its own (a sub-agent's): not the main history
        if in_main and head.parent is None and history is not None and leaves and _replaces(head, history):
            carried = [leaf for leaf in leaves if _carried_into(leaf, head)]
            compaction = carried[-1] if carried else leaves[-1]
            how = "its answer is in that prompt" if carried else "it is the last call before it that nothing continued"
            compactions[compaction.sequence] = (
                f"compaction: the main conversation restarted after it (sequence {head.sequence}) from a "
                f"{len(head.prompt)}-token prompt that no longer holds the history before; {how}"
            )
            edges[head.key] = compaction
            history, leaves = None, []
        if in_main and (history is None or _length(head) > _length(history)):
            history = head
        if head.sequence not in continued:
            leaves.append(head)
    return edges, compactions


def _length(node: _Call) -> int:
    return len(node.prompt) + len(node.response)


def _replaces(restart: _Call, history: _Call) -> bool:
    """Whether `restart`'s prompt, past what it shares with `history`'s, is shorter than `history`'s
    conversation past that point: the history was replaced, not rendered again (as DSPy does)."""
    shared = _common_prefix(restart.prompt, history.prompt)
    return len(restart.prompt) - shared < _length(history) - shared


def _common_prefix(a: array[int], b: array[int]) -> int:
    """How many leading tokens `a` and `b` share (a binary search over C-level slice compares)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _carried_into(node: _Call, later: _Call) -> bool:
    """Whether `later`'s request carried `node`'s answer: the proxy found its text there
    (`LLMCall.carries`), or its sampled ids appear, token for token, in `later`'s prompt."""
    if node.sequence in later.call.carries:
        return True
    probe = node.answer_probe()
    if probe is None:
        return False
    haystack = later.prompt.tobytes()
    found = haystack.find(probe)
    while found >= 0:
        if found % later.prompt.itemsize == 0:
            return True
        found = haystack.find(probe, found + 1)
    return False


def _outside_main(members: list[_Call], heads: list[_Call]) -> tuple[CallClass, str]:
    """Rules 6-7 for a tree outside the main conversation."""
    root, last = members[0], members[-1]
    if root.via == "declared":
        assert root.parent is not None  # a declared edge always names its parent
        return CallClass.SUBAGENT, f"subagent: its first call declared parent sequence {root.parent.sequence}"
    if len(members) > 1:
        return CallClass.SUBAGENT, f"subagent: a conversation of its own ({len(members)} calls) beside the main one"
    for later in heads:
        if later.sequence > last.sequence and later.tree != root.sequence and later.parent is not None:
            if _carried_into(last, later):
                return (
                    CallClass.SUBAGENT,
                    f"subagent: its answer returns into the conversation at sequence {later.sequence}",
                )
    return (
        CallClass.SIDE,
        "side: never continued, shares no history with the main conversation, its answer is used nowhere",
    )


def _last_main_before(node: _Call, heads: list[_Call], main_trees: set[int]) -> _Call | None:
    spawner = None
    for head in heads:
        if head.sequence >= node.sequence:
            break
        if head.tree in main_trees:
            spawner = head
    return spawner


def _check_main_leaves(ordered: list[_Call], graph: RolloutGraph) -> None:
    """Warn when declared classes leave two main conversations running at once (both still train as main)."""
    if not any(node.call.declared_class is not None for node in ordered):
        return
    spans: dict[int, tuple[int, int]] = {}
    for node in ordered:
        if graph.nodes[node.key].call_class is CallClass.MAIN:
            first, last = spans.get(node.tree, (node.sequence, node.sequence))
            spans[node.tree] = (min(first, node.sequence), max(last, node.sequence))
    ranges = sorted(spans.values())
    for (first_a, last_a), (first_b, last_b) in zip(ranges, ranges[1:], strict=False):
        if first_b < last_a:
            graph.warn(
                f"two main conversations run at once (sequences {first_a}-{last_a} and {first_b}-{last_b}), as "
                "declared; both train as main (rule: a declared class wins over the graph)"
            )
