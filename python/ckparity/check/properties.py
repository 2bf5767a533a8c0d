"""The properties ``ckparity check`` runs on a backend, each a set of cases
against torch (and torch in float64, the exact answer's stand-in), filled
into a ``Property``: its cases, how many failed, grouped by what the cases
vary besides the width, and the worst failures with their figures."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Callable

import torch

from ..kernels import layouts as laid_out
from ..kernels.record import Conformance
from ..kernels.sweeping import SPECIAL_ROWS, SPECIAL_WIDTHS, special_rows
from ..measure import RULES, differing_elements, max_ulp, parity
from .rule import VERDICTS

ROWS = (1, 3)
WORST_KEPT = 5  # failures a property's report lists in full, worst first

# where a case is about to run: check's child says so on stderr, so a crash
# that ends it names its property and case
TRACE: Callable[[str], None] | None = None


def at(prop: "Property", label: str) -> None:
    if TRACE is not None:
        TRACE(json.dumps({"property": prop.name, "case": label}))


def _group(label: str) -> str:
    """What a case varies besides its width or size: the key failures are counted by."""
    rest = re.sub(r"(^|,)(width|size)=\d+", "", label).strip(",")
    return rest or "all"


class Property:
    """Figures and the verdict of one property, filled case by case."""

    def __init__(self, name: str) -> None:
        self.name, self.cases, self.bit_identical, self.max_ulp = name, 0, 0, 0
        self.worst = "bitwise"
        self.findings: list[dict] = []  # one per failing case: its worst quantity, with figures
        self.groups: dict[str, dict] = {}
        self.extra: dict = {}  # a property's own figures, in its report (batch_invariance's counts)

    def case(self, label: str, verdict: str, why: str | None = None, figures: dict | None = None,
             group: str | None = None) -> None:
        """One case's verdict (``why`` and ``figures`` for a failing one), counted in ``group``
        (default: what the label varies besides the width)."""
        self.cases += 1
        group = self.groups.setdefault(group or _group(label), {"cases": 0, "failing": 0})
        group["cases"] += 1
        self.bit_identical += verdict == "bitwise"
        if VERDICTS.index(verdict) > VERDICTS.index(self.worst):
            self.worst = verdict
        if why is not None:
            group["failing"] += 1
            self.findings.append({"case": label, "verdict": verdict, "why": why, **(figures or {})})

    def compare(self, label: str, ours: dict, theirs: dict, exact: dict, group: str | None = None) -> None:
        worst, why, figures = "bitwise", None, None
        for k in theirs:
            if ours[k] is None or ours[k].shape != theirs[k].shape:
                worst, why = "wrong", (f"{k}: shape {None if ours[k] is None else tuple(ours[k].shape)}, "
                                       f"torch's {tuple(theirs[k].shape)}")
                break
            self.max_ulp = max(self.max_ulp, max_ulp(ours[k], theirs[k]))
            if differing_elements(ours[k], theirs[k]) == 0:
                continue  # torch's bits: bitwise, whatever float64 makes of them (a NaN where bf16 has inf)
            fig = parity(k, ours[k], theirs[k], exact[k], *RULES["default"])
            if fig["ok"]:
                verdict = "as accurate as torch"
            else:
                verdict = "wrong" if fig["reason"].startswith("not close") else "less accurate"
            if VERDICTS.index(verdict) > VERDICTS.index(worst):
                worst = verdict
                if not fig["ok"]:
                    why, figures = f"{k}: {fig['reason']}", {key: fig[key] for key in (
                        "max_abs", "max_ulp", "ckparity_error64", "torch_error64")}
        self.case(label, worst, why, figures, group)

    def report(self) -> dict:
        worst = sorted(self.findings, key=lambda f: (-VERDICTS.index(f["verdict"]), -f.get("max_ulp", 0)))
        return {"property": self.name, "cases": self.cases, "bit_identical": self.bit_identical,
                "failing": len(self.findings), "max_ulp": self.max_ulp, "verdict": self.worst,
                "groups": self.groups, "worst": worst[:WORST_KEPT],
                "failures": [f"{f['case']}: {f['why']}" for f in worst[:WORST_KEPT]], **self.extra}


def floating(t: dict, dtype) -> dict:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in t.items()}


def evaluate(kernel_slot: Conformance, fn: Callable, tensors: dict, dtype=torch.float32,
             layout: tuple[str, Callable] | None = None) -> dict:
    """The output and the gradients of a fixed random weighting of it; with
    ``layout`` (name, map: kernels/layouts.py), that input reaches fn laid out
    by the map (its gradient flows back through it)."""
    return laid_out.run(kernel_slot.call, kernel_slot.differentiated, fn, tensors, dtype, layout)


def run_case(prop: Property, label: str, evaluate_with: Callable[[Callable, torch.dtype], dict], fn,
             torch_fn, group: str | None = None, dtype: torch.dtype = torch.float32) -> None:
    """evaluate_with(f, dtype) -> the outputs: the backend's against torch's, both in the check's
    ``dtype``, and torch's in float64 (of the same values: the cases' inputs are ``dtype`` values)."""
    at(prop, label)
    try:
        ours = evaluate_with(fn, dtype)
    except Exception as err:  # noqa: BLE001 -- a backend raising on valid input is the finding
        prop.case(label, "crashes", f"{type(err).__name__}: {err}", group=group)
        return
    prop.compare(label, ours, evaluate_with(torch_fn, dtype), evaluate_with(torch_fn, torch.float64), group)


def _slot_case(kernel_slot: Conformance, tensors: dict) -> Callable[[Callable, torch.dtype], dict]:
    return lambda f, dtype: evaluate(kernel_slot, f, tensors, dtype)


def contract(record, fn) -> Property:
    """The slot's contract check, run here rather than at registration
    (deferred in check's child, so a crash in it is a verdict)."""
    from ..kernels.contract import ContractError

    prop = Property("contract")
    at(prop, "the contract's small call")
    try:
        record.contract(fn)
        prop.case("the contract's small call", "bitwise")
    except ContractError as err:
        prop.case("the contract's small call", "wrong", f"breaks its contract: {err}")
    except Exception as err:  # noqa: BLE001
        prop.case("the contract's small call", "crashes", f"{type(err).__name__}: {err}")
    return prop


def widths(kernel_slot, fn, torch_fn, g, dtype=torch.float32) -> Property:
    prop = Property("widths")
    for width in kernel_slot.widths:
        for rows in kernel_slot.rows or ROWS:
            run_case(prop, f"width={width},rows={rows}", _slot_case(kernel_slot, kernel_slot.make(width, rows, g)),
                     fn, torch_fn, dtype=dtype)
    return prop


def options(kernel_slot, fn, torch_fn, g, unsupported: frozenset, dtype=torch.float32,
            refused: dict | None = None) -> Property:
    """What the slot's contract passes besides the plain call, each as the slot
    with another call; an option the backend declares unsupported is drawn
    (the generator's sequence stays that of a backend that supports it) but not
    run. In a dtype other than float32, an option whose first call raises a
    TypeError (the backend has it in float32 only) goes into ``refused`` with
    the error instead of being run."""
    prop = Property("options")
    for width in (7, 64, 257, 1000):
        tensors = kernel_slot.make(width, 3, g)
        for name, call, differentiated in kernel_slot.options:
            if name in unsupported or (refused is not None and name in refused):
                continue
            variant = replace(kernel_slot, call=call, differentiated=differentiated)
            if dtype != torch.float32 and refused is not None:
                try:
                    evaluate(variant, fn, tensors, dtype)
                except TypeError as err:
                    refused[name] = f"{type(err).__name__}: {err}"
                    continue
                except Exception:  # noqa: BLE001 -- the case below reports it
                    pass
            run_case(prop, f"width={width},{name}", _slot_case(variant, tensors), fn, torch_fn, dtype=dtype)
    return prop


ZERO_ROWS_FROM = 5  # the rows a case is drawn with before they are cut to 0: no slot's other sizes


def _zero_rows(tensors: dict) -> dict:
    """A case drawn with ZERO_ROWS_FROM rows, with 0: every tensor with a dimension of rows first cut to 0."""
    return {k: v[:0] if v.dim() and v.shape[0] == ZERO_ROWS_FROM else v for k, v in tensors.items()}


def layouts(kernel_slot, fn, torch_fn, g, dtype=torch.float32) -> Property:
    """Every tensor of the slot's call in every layout torch accepts (kernels/layouts.py: strided,
    transposed, a storage offset, expanded rows and columns), judged as every case is against torch
    on a contiguous copy of the same values and float64: a backend that reads a view as if it were
    contiguous computes other values ("wrong"), one that raises on a layout torch takes "crashes".
    torch's own bits can move with a layout (its eager rms_norm and silu on a transposed input sum
    and vectorize in another order), so bits equal to torch's on the layout itself are bitwise too;
    the report counts the cases whose bits moved with the layout (``layout_dependent``: ckparity's
    own kernels give their contiguous bits on every layout, tests/test_layouts.py). And the call
    with 0 rows, against torch's."""
    prop, moved = Property("layouts"), 0
    for width in (8, 34, 1000):  # even: rope's head dim is
        tensors = kernel_slot.make(width, 3, g)
        for name, t in tensors.items():
            for layout_name, layout in laid_out.applicable(t):
                label = f"width={width},{name} {layout_name}"
                at(prop, label)
                copy = (name, laid_out.contiguous_copy(layout))
                try:
                    view, own_copy = (evaluate(kernel_slot, fn, tensors, dtype, lay) for lay in ((name, layout), copy))
                except Exception as err:  # noqa: BLE001
                    prop.case(label, "crashes", f"{type(err).__name__}: {err}")
                    continue
                moved += differing_elements_all(view, own_copy) > 0
                theirs_on_layout = evaluate(kernel_slot, torch_fn, tensors, dtype, (name, layout))
                if differing_elements_all(view, theirs_on_layout) == 0:
                    prop.case(label, "bitwise")
                    continue
                prop.compare(label, view, *(evaluate(kernel_slot, torch_fn, tensors, d, copy)
                                            for d in (dtype, torch.float64)))
    run_case(prop, "0 rows", _slot_case(kernel_slot, _zero_rows(kernel_slot.make(8, ZERO_ROWS_FROM, g))), fn,
             torch_fn, dtype=dtype)
    prop.extra = {"layout_dependent": moved}
    return prop


def _at_1_and_2_threads(run: Callable[[], dict]) -> list[dict]:
    before = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(run())
        return results
    finally:
        torch.set_num_threads(before)


def at_thread_counts(prop: Property, what: str, run: Callable[[], dict],
                     run_torch: Callable[[], dict] | None = None) -> Property:
    """run() at 1 and 2 torch threads: one case, bit-identical or nondeterministic. Where torch's own
    bits move with its thread count (``run_torch``: torch's MKL GEMMs split K between 2 threads on an
    Intel Xeon), a backend with torch's bits at each count follows torch: bitwise too."""
    at(prop, what)
    try:
        results = _at_1_and_2_threads(run)
    except Exception as err:  # noqa: BLE001
        prop.case(what, "crashes", f"{type(err).__name__}: {err}")
        return prop
    if differing_elements_all(results[0], results[1]) == 0:
        prop.case(what, "bitwise")
        return prop
    theirs = _at_1_and_2_threads(run_torch) if run_torch is not None else None
    if theirs is not None and all(differing_elements_all(a, b) == 0 for a, b in zip(results, theirs)):
        prop.case(what, "bitwise")  # torch's bits at 1 and at 2 threads
        prop.extra = {"follows_torch": True}
    else:
        prop.case(what, "nondeterministic", "1 and 2 torch threads give different bits")
    return prop


def threads(kernel_slot, fn, torch_fn, g, dtype=torch.float32) -> Property:
    tensors = kernel_slot.make(4096, 64, g)  # above every OpenMP threshold of ckparity's kernels
    return at_thread_counts(Property("threads"), "64 rows of 4096", lambda: evaluate(kernel_slot, fn, tensors, dtype),
                            lambda: evaluate(kernel_slot, torch_fn, tensors, dtype))


# batch invariance: the row's widths (65537: one row past torch's 2^16-element split of a lone
# row over its threads), the batches it sits in, and where in them
BATCH_WIDTHS = (8, 100, 1000, 4096, 65537)
BATCHES = (1, 2, 3, 4, 8, 17)


def _arrangements():
    """(batch, position, threads) of every arrangement but the row alone on one thread."""
    for batch in BATCHES:
        for position in sorted({0, batch // 2, batch - 1}):
            for n in (1, 2):
                if (batch, n) != (1, 1):
                    yield batch, position, n


def _row_of(result: dict, keys: set[str], position: int) -> dict:
    """The outputs of ``keys`` (the output and the per-row inputs' gradients)
    at the row's ``position``; a 0-dim output whole (the loss: a mean over
    the one valid row)."""
    return {k: (result[k] if result[k].dim() == 0 else result[k][position]) for k in keys}


def _placed(pool: dict, rows: int, batch: int, position: int) -> dict:
    """The batch: row 0 of the pool at ``position``, other pool rows around it;
    their targets ignored (-100), so a mean over valid rows is the row's own."""
    order = list(range(1, batch)) if batch > 1 else []
    order.insert(position, 0)
    out = {k: (v[order] if v.dim() and v.shape[0] == rows else v) for k, v in pool.items()}
    if "targets" in out:
        out["targets"] = out["targets"].clone()
        out["targets"][[i for i in range(batch) if i != position]] = -100
    return out


def _evaluate_placed(kernel_slot, fn, pool: dict, rows: int, batch: int, position: int, dtype) -> dict:
    """evaluate() on the batch _placed() makes, with the upstream gradient's
    rows placed as the inputs' are (the row's own upstream in every batch; a
    0-dim loss gets 1)."""
    tensors = _placed(pool, rows, batch, position)
    leaves = {k: v.detach().clone().requires_grad_(k in kernel_slot.differentiated)
              for k, v in floating(tensors, dtype).items()}
    out = kernel_slot.call(fn, leaves)
    if out.dim() == 0:
        upstream = torch.ones((), dtype=dtype)
    else:
        gen = torch.Generator().manual_seed(1)
        upstream = _placed({"u": torch.randn(rows, *out.shape[1:], generator=gen)}, rows, batch, position)["u"]
    out.backward(upstream.to(dtype))
    return {"out": out.detach(), **{f"d{k}": leaves[k].grad for k in kernel_slot.differentiated}}


def batch_invariance(kernel_slot, fn, torch_fn, g, dtype=torch.float32) -> Property:
    """The same row gives the same bits whatever batch it sits in: at every
    batch of BATCHES, at its start, middle and end, at 1 and 2 threads,
    against the row alone on one thread (its output row and its gradient rows;
    a cross-entropy row with its neighbours ignored, its loss too). torch is
    run on the same arrangements: a row torch itself gives other bits (a lone
    row of 2^16 or more elements torch sums split over its threads) is
    "follows torch" when the backend's bits are torch's in every arrangement
    -- following torch's bits means following its variance -- and the
    report counts both. A row that moves only where torch's moves too, with
    other bits somewhere (a GEMM following MKL's paths per batch size, one of
    them not followed), is "as accurate as torch", never bitwise."""
    prop = Property("batch_invariance")
    counts = {"arrangements": 0, "ours_variant": 0, "torch_variant": 0, "follows_torch": 0}
    rows = max(BATCHES)
    before = torch.get_num_threads()
    try:
        for width in kernel_slot.batch_widths or BATCH_WIDTHS:
            pool = kernel_slot.make(width, rows, g)
            if not any(v.dim() and v.shape[0] == rows for v in pool.values()):
                return prop  # no per-row tensors (rope's rows are positions tied to its cos and sin)
            label = f"width={width}"
            at(prop, label)
            # the row's own: the output, and the gradients of inputs with a row per batch row (not a weight's)
            keys = {"out"} | {f"d{k}" for k in kernel_slot.differentiated if pool[k].dim() and pool[k].shape[0] == rows}

            def row(f, batch, position, n):
                torch.set_num_threads(n)
                return _row_of(_evaluate_placed(kernel_slot, f, pool, rows, batch, position, dtype), keys, position)

            try:
                alone = {"ours": row(fn, 1, 0, 1), "torch": row(torch_fn, 1, 0, 1)}
                varied, alone_in_varying, differs_from_torch, first = 0, 0, False, None
                for batch, position, n in _arrangements():
                    ours, theirs = row(fn, batch, position, n), row(torch_fn, batch, position, n)
                    counts["arrangements"] += 1
                    ours_moved = any(differing_elements(ours[k], alone["ours"][k]) for k in ours)
                    counts["ours_variant"] += ours_moved
                    torch_moved = any(differing_elements(theirs[k], alone["torch"][k]) for k in theirs)
                    counts["torch_variant"] += torch_moved
                    differs_from_torch |= any(differing_elements(ours[k], theirs[k]) for k in ours)
                    if ours_moved:
                        varied += 1
                        alone_in_varying += not torch_moved
                        first = first or f"batch {batch}, position {position}, {n} thread{'s' if n > 1 else ''}"
            except Exception as err:  # noqa: BLE001
                prop.case(label, "crashes", f"{type(err).__name__}: {err}")
                continue
            if not varied:
                prop.case(label, "bitwise")
            elif not differs_from_torch and differing_elements_all(alone["ours"], alone["torch"]) == 0:
                counts["follows_torch"] += varied
                prop.case(label, "bitwise")  # torch's bits in every arrangement, its variance with them
            elif not alone_in_varying:  # torch's row moves wherever ours does: its paths followed, not all its bits
                counts["follows_torch"] += varied
                prop.case(label, "as accurate as torch", f"the row's bits depend on its batch where torch's do "
                                                         f"({varied} arrangements), not always as torch's")
            else:
                prop.case(label, "nondeterministic", f"the row's bits depend on its batch: {varied} arrangements "
                                                     f"differ from the row alone (first: {first})")
    finally:
        torch.set_num_threads(before)
    prop.extra = counts
    return prop


def differing_elements_all(a: dict, b: dict) -> int:
    """Elements differing over every output; a gradient one side lacks (None) differs whole."""
    return sum(differing_elements(a[k], b[k]) if a[k] is not None and b[k] is not None
               else (0 if a[k] is None and b[k] is None else 1) for k in a)


def _with_special_rows(tensors: dict, name: str, g: torch.Generator) -> dict:
    """tensors with ``name``'s rows (its last dimension) taken from special_rows, cycling."""
    t = tensors[name]
    flat = t.reshape(-1, t.shape[-1]).clone()
    special = special_rows(g, t.shape[-1], torch.float32)
    flat.copy_(special[torch.arange(flat.shape[0]) % special.shape[0]])
    return {**tensors, name: flat.reshape(t.shape)}


def non_finite(kernel_slot, fn, torch_fn, g, dtype=torch.float32) -> Property:
    """The slot's first differentiated input (the activations, the logits) holding what kernels get wrong
    quietly: rows with a NaN, an inf beside a -inf, an inf alone (at the vector lanes and tails), all
    -inf, a zero maximum of either sign, a spread of 120 (exps in the subnormals) -- special_rows, the
    rows every ckparity sweep runs. The backend's outputs and gradients are compared as every case is:
    NaN and infinities where torch's are (a kernel that turns a NaN row into zeros, or drops an inf, is
    "wrong"), the rest by the rule."""
    prop = Property("non_finite")
    name = kernel_slot.differentiated[0]
    widths = [w for w in kernel_slot.widths if w in SPECIAL_WIDTHS] or kernel_slot.widths[:3]
    for width in widths:
        tensors = _with_special_rows(kernel_slot.make(width, SPECIAL_ROWS, g), name, g)
        run_case(prop, f"width={width}", _slot_case(kernel_slot, tensors), fn, torch_fn, dtype=dtype)
    return prop


def bad_input(kernel_slot, fn, kinds: set[str]) -> Property:
    """Each of the slot's bad inputs of ``kinds`` must raise; returning is wrong."""
    prop = Property("bad_input")
    for bad in kernel_slot.bad:
        if bad.kind in kinds:
            at(prop, bad.what)
            try:
                bad.call(fn)
            except Exception:  # noqa: BLE001 -- any clear refusal will do
                prop.case(bad.what, "bitwise")
            else:
                prop.case(bad.what, "wrong", "accepted without an error")
    return prop


def torch_inputs(kernel_slot: Conformance, fn, torch_fn, not_run: dict, dtype=torch.float32) -> Property:
    """torch's own OpInfo samples of the op the slot stands for, those within the slot's contract."""
    prop = Property("torch_inputs")
    if kernel_slot.opinfo is None:
        return prop
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as err:  # torch's test inputs need expecttest
        not_run["torch_inputs"] = f"torch's OpInfo samples need expecttest ({err}); pip install expecttest"
        return prop
    name, adapt = kernel_slot.opinfo
    op = next(o for o in op_db if o.name == name and o.variant_test_name == "")
    for k, sample in enumerate(op.sample_inputs("cpu", dtype, requires_grad=True)):
        case = adapt(sample)
        if case is None:
            continue
        call, tensors, differentiated = case
        tensors = {key: t.detach() for key, t in tensors.items()}
        sample_slot = Conformance(None, call, differentiated, [])
        shape = tuple(tensors[differentiated[0]].shape)
        run_case(prop, f"{name} sample {k} {shape}", _slot_case(sample_slot, tensors), fn, torch_fn,
                 group=f"{len(shape)}-D samples", dtype=dtype)
    return prop


# ---- adamw: the optimizer slot, stepped rather than differentiated ------------

ADAMW_STEPS = 20


def adamw_run(make: Callable, size: int, seed: int, steps: int, dtype=torch.float32, values=torch.float32) -> dict:
    """``steps`` steps of the optimizer ``make`` builds, as the harness calls it, on one
    tensor of ``size`` with seeded gradients (``values``: their dtype, evaluated in ``dtype``):
    the param and the moments under torch's names."""
    g = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter(torch.randn(size, generator=g).to(values).to(dtype))
    optimizer = make([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    for _ in range(steps):
        p.grad = torch.randn(size, generator=g).to(values).to(dtype)
        optimizer.step()
    state = optimizer.state[p]
    return {"param": p.detach(), "exp_avg": state["exp_avg"], "exp_avg_sq": state["exp_avg_sq"]}


def adamw_sizes(fn: Callable, torch_fn: Callable, sizes: list[int], steps: int = ADAMW_STEPS,
                dtype=torch.float32) -> Property:
    """The optimizer ``fn`` makes against torch's AdamW and float64, one case per size."""
    prop = Property("sizes")
    for size in sizes:
        run_case(prop, f"size={size}",
                 lambda f, d, size=size: adamw_run(f, size, size, steps, d, values=dtype), fn, torch_fn, dtype=dtype)
    return prop


def adamw_threads(fn: Callable, dtype=torch.float32) -> Property:
    # 200003 params: several of the C AdamW's 65536-float chunks
    return at_thread_counts(Property("threads"), "200003 params",
                            lambda: adamw_run(fn, 200003, 7, ADAMW_STEPS, dtype, values=dtype))
