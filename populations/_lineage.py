"""Ancestry trees: a candidate and, recursively, the candidates it was made from, across the
shapes of an archive (``evo inspect --lineage``, ``evo report``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from ._records import Candidate
from ._shape import Shape
from ._shape_log import ShapeLog

__all__ = ["LineageNode", "build_lineage"]


@dataclass(frozen=True)
class LineageNode:
    """A candidate and, recursively, the candidates it was made from (``Candidate.parents``).

    ``candidate`` is None for a parent that is not in the archive. Through crossover a
    candidate can appear twice in one ancestry; its second appearance has ``repeated=True``
    and no parents listed (they are under the first).
    """

    candidate_id: str
    candidate: Optional[Candidate]
    shapes: tuple[Shape, ...]
    parents: tuple["LineageNode", ...] = ()
    repeated: bool = False

    def walk(self) -> Iterator[tuple[int, "LineageNode"]]:
        """(depth, node) in depth-first order, without recursion (ancestries can be deep)."""
        stack = [(0, self)]
        while stack:
            depth, node = stack.pop()
            yield depth, node
            stack.extend((depth + 1, p) for p in reversed(node.parents))


def build_lineage(root: str, shape_logs: Sequence[ShapeLog]) -> LineageNode:
    """The ancestry tree of candidate ``root`` (a full id), read from ``shape_logs``."""
    # Depth-first, pre-order, with an explicit stack: occurrence i's parents all get larger
    # indices, so the frozen nodes can then be built from the last occurrence backwards.
    occurrences: list[tuple[str, bool, list[int]]] = []
    expanded: set[str] = set()
    stack: list[tuple[str, int]] = [(root, -1)]
    cands: dict[str, Optional[Candidate]] = {}
    while stack:
        cid, child = stack.pop()
        repeated = cid in expanded
        occurrences.append((cid, repeated, []))
        if child >= 0:
            occurrences[child][2].append(len(occurrences) - 1)
        if not repeated:
            expanded.add(cid)
            holder = next((s for s in shape_logs if cid in s.cands), None)
            cand = cands[cid] = holder.find(holder.cands[cid]) if holder else None  # type: ignore[assignment]
            for parent in reversed(cand.parents if cand else ()):
                stack.append((parent, len(occurrences) - 1))
    nodes: list[Optional[LineageNode]] = [None] * len(occurrences)
    for i in range(len(occurrences) - 1, -1, -1):
        cid, repeated, parents = occurrences[i]
        nodes[i] = LineageNode(cid, cands.get(cid), tuple(s.shape for s in shape_logs if cid in s.cands),
                               tuple(nodes[j] for j in parents), repeated)  # type: ignore[misc]
    return nodes[0]  # type: ignore[return-value]
