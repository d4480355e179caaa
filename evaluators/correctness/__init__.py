"""The correctness checks a candidate's output goes through inside the GPU worker: the tolerances
(``_tolerance.py``), the guarded buffers (``_buffers.py``), the reference (``_reference.py``), the
cascade of checks per shape (``_correctness.py``), a generic claim's class-cover instances checked
together (``_cover.py``) and the rotation's rechecks after timing (``_recheck.py``).

These modules import torch: only the worker's harness (``evaluators/run/_harness.py``) imports this
package, and ``evaluators/__init__.py`` never does, so importing ``evaluators`` never loads torch.
"""
from ._buffers import PLACEMENT_ALIGN, WORKSPACE_FILLS, Guarded, Operands, workspace_fill
from ._correctness import Cascade
from ._cover import COVER_CHECK, CoverItem, CoverOperands, check_cover
from ._instances import MAX_INSTANCES, alignment_class, beyond_claim, class_cover, large_ragged, ragged_instances
from ._recheck import RotationReference, recheck_sets, verify_sets
from ._probes import POISONS, SCRAMBLE_MASK, CancellationDraws, cancellation_draws, draw_random, embed_cancellation, poison_, scramble_, scramble_mask
from ._reference import integer_reference, reference, reference_scales
from ._tolerance import (EPS16, EPS32, FP64_LIMIT, CheckFailed, tolerance_exact, tolerance_random, tolerance_strict,
                         ulp16)

__all__ = ["PLACEMENT_ALIGN", "WORKSPACE_FILLS", "Guarded", "Operands", "workspace_fill",
           "Cascade", "COVER_CHECK", "CoverItem", "CoverOperands", "check_cover", "MAX_INSTANCES", "alignment_class", "beyond_claim", "class_cover", "large_ragged",
           "ragged_instances",
           "RotationReference", "recheck_sets", "verify_sets",
           "POISONS", "SCRAMBLE_MASK", "CancellationDraws", "cancellation_draws", "draw_random", "embed_cancellation", "poison_", "scramble_", "scramble_mask",
           "integer_reference", "reference", "reference_scales",
           "EPS16", "EPS32", "FP64_LIMIT", "CheckFailed", "tolerance_exact", "tolerance_random", "tolerance_strict",
           "ulp16"]
