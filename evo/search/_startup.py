"""Start-up of a run: every shape's record rebuilt from the archive, new shapes seeded.

Resuming is re-running the same command: each shape's evaluations in the archive are fed to its
:class:`ShapeState` again (population, convergence, stall detection, history), candidates a
killed run submitted but never saw evaluated are queued, and a shape with nothing archived gets
its seeds: the templates' heuristic picks and spread-out samples (``_seeding.py``) and the
transferred elites of the nearest archived shapes (``_transfer.py``), taken in turn. The shape's
own first picks lead unless the nearest archived shape is within ``transfer.near`` (log2
distance): a run of a hundred shapes gives each a handful of evaluations at first, and elites
moved from shapes far away (a 64 x 128 split-K tile that won on an anchor, moved to 236x5024x6040)
used them all when transfers came first (seed 6 of the random-shape benchmark: the second wave's
mid shapes got 7-9 evaluations, every one a transfer from anchors a median log2 distance of 2.3
away, none a pick made for the shape).
"""
from __future__ import annotations

from populations import Candidate, Evaluation, Shape

from ._seeding import by_rank, seed_population
from ._services import EngineServices
from ._shape_state import ShapeState
from ._transfer import shape_distance, transfer_candidates

__all__ = ["prepare_states"]


def prepare_states(services: EngineServices) -> None:
    """Rebuild each shape's record from the archive; seed the shapes that have nothing yet."""
    archive, progress = services.archive, services.progress
    archived = set(archive.shapes())
    for shape, state in services.states.items():
        evaluated: set[str] = set()
        if shape in archived:
            cands = {c.id: c for c in archive.candidates(shape)}
            for ev in archive.evaluations(shape):
                evaluated.add(ev.candidate_id)
                cand = cands.get(ev.candidate_id)
                if cand is not None:
                    state.observe(cand, ev)
            # candidates a killed run submitted but never saw evaluated: evaluate them now
            for cid, cand in cands.items():
                if cid not in evaluated:
                    state.queue.append((cand, "archived"))
        state.known.update(evaluated)
        best = state.population.best
        progress.stats[shape].best = best.fitness if best else None
        if state.conv.converged:
            state.converged = True
        if not evaluated and not state.queue:
            _seed(services, state, archived)


def _seed(services: EngineServices, state: ShapeState, archived: set[Shape]) -> None:
    """Queue ``state``'s seeds: its own picks and transferred elites in turn (ids once); transfers
    lead when the nearest archived shape is within ``transfer.near``."""
    cfg, shape = services.config, state.shape
    transfers: list[Candidate] = []
    if cfg.transfer.enabled and cfg.transfer.neighbors > 0:
        def elites_of(s: Shape, n: int) -> list[tuple[Candidate, Evaluation]]:
            return [(e.candidate, e.latest) for e in services.archive.elites(s, n) if e.candidate is not None]

        transfers = transfer_candidates(shape, archived, elites_of, services.templates,
                                        neighbors=cfg.transfer.neighbors, per_neighbor=cfg.transfer.per_neighbor,
                                        specialize=cfg.specialize, arch=services.arch)
    own = seed_population(shape, list(services.templates.values()), cfg.seeds_per_template, services.rng,
                          arch=services.arch, specialize=cfg.specialize)
    near = bool(transfers) and min(shape_distance(shape, Shape.parse(str(c.meta["transfer_from"])))
                                   for c in transfers) <= cfg.transfer.near
    tagged_t = [(c, "transfer") for c in transfers]
    tagged_o = [(c, "seed") for c in own]
    lead, follow = (tagged_t, tagged_o) if near else (tagged_o, tagged_t)
    # a candidate in both lists keeps its place in the leading one: dropping it from the following
    # list before the two are interleaved keeps them in turn (dropped after, it left two of the
    # leading list's side by side, and the shape's own picks came later than their turn)
    led = {c.id for c, _ in lead}
    seeds = by_rank([lead, [(c, op) for c, op in follow if c.id not in led]])
    seen: set[str] = set()
    for cand, op in seeds:
        if cand.id not in seen:
            seen.add(cand.id)
            state.queue.append((cand, op))
    services.events.emit("seed", shape, transferred=len(transfers), templates=len(own),
                         lead="transfer" if near else "templates")

