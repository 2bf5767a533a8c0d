"""The kernel spine and the package's layers.

- every import in the package, lazy ones included, goes downward through
  the layers (C bindings -> ops -> kernels -> suites and harness -> cli) and
  closes no circle;
- ``import ckparity`` loads no harness module;
- every kernel record keeps the spine's rules: a flag the twins' config
  has, torch's backend, a contract its own backends pass, claims with a
  sweep, conformance widths that cover 1..300.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

import ckparity
from ckparity import kernels
from ckparity.harness.basics.config import RunConfig

PACKAGE = Path(ckparity.__file__).parent

# the layers, lowest first; a module may import its own layer or a lower one
LAYERS = [
    {"_native", "_bindings", "_tensors", "_pool", "errors", "threads", "cpu"},  # the C library and its bindings
    {"ops", "optim", "nn", "reference", "measure", "distributed", "plugin"},  # ops on the bindings
    {"kernels"},  # one record per kernel
    {"__init__"},  # the package's face: the ops and register_backend
    {"check", "gates", "sweep", "bench", "bench_memory", "bench_ranks", "builds", "mutate", "harness",
     "pytest_plugin"},  # the suites and the harness
    {"zoo"},  # planted bugs, scored with the suites and the harness
    {"cli", "__main__"},
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Every ckparity module ``module`` imports, at any depth of its code (lazy imports too)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != module:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, set(modules)) for m, p in modules.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    top = "__init__" if len(parts) == 1 else parts[1]
    return next(k for k, layer in enumerate(LAYERS) if top in layer)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_lazy_imports_included():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = _graph()
    graph["ckparity.harness.ranks.launch"].add("ckparity.cli")  # the circle this layout once had
    assert any("ckparity.cli" in c and "ckparity.harness.ranks.launch" in c for c in _cycles(graph))


def test_layers_import_downward_only():
    upward = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
              for m, targets in _graph().items() for t in targets if _layer(t) > _layer(m)]
    assert upward == []


# the harness's folders, lowest first: a module imports its own folder or a lower one
HARNESS_ORDER = ["basics", "twins", "observers", "longrun", "loop", "ranks", "studies"]


def test_the_harness_folders_import_downward_only():
    def folder(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 3 and parts[1] == "harness" else None

    graph = _graph()
    assert {folder(m) for m in graph} - {None} == set(HARNESS_ORDER)
    upward = [f"{m} imports {t}" for m, targets in graph.items() for t in targets
              if folder(m) and folder(t) and HARNESS_ORDER.index(folder(t)) > HARNESS_ORDER.index(folder(m))]
    assert upward == []  # (--init-from a checkpoint directory reads it with basics/checkpoint_format.py)


def test_every_module_has_a_layer():
    for module in _modules():
        _layer(module)  # StopIteration: a module no layer names


def test_import_ckparity_loads_no_harness_module():
    code = "import sys, ckparity; print(sorted(m for m in sys.modules if m.startswith('ckparity.harness')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---- the records -------------------------------------------------------------

@pytest.mark.parametrize("name", list(kernels.KERNELS))
def test_a_record_keeps_the_spines_rules(name):
    record = kernels.KERNELS[name]
    assert record.name == name and "torch" in record.backends
    # ckparity's C where it claims torch's bits; a slot without C yet says so (torch's backend judges users')
    assert "c" in record.backends or (not record.claims and name in " ".join(record.not_claimed)), name
    assert record.flag in {f.name for f in fields(RunConfig)}, f"{record.flag}: no such RunConfig field"
    for backend in record.builtin:
        record.contract(record.backends[backend])  # ContractError if ckparity's own breaks it
    for claim in record.claims:
        assert claim.key == name or claim.key.startswith(f"{name}."), claim.key
        assert callable(claim.sweep) and claim.quantities and claim.capabilities
    if record.conformance is not None and not record.optimizer:
        covered = set(record.conformance.widths)
        assert covered >= set(range(2, 301, 2)), "the conformance widths must cover 1..300 (even ones for rope)"


def test_every_op_of_the_twins_is_a_records_slot():
    """The models call ops.<slot> for every op of the step; Ops has a field per record's slot, and no other
    (head_loss: the lm_head and the loss fused, the loss slot's c_fused_linear)."""
    from dataclasses import fields as dataclass_fields

    from ckparity.harness.twins.models import Ops
    assert {f.name for f in dataclass_fields(Ops)} - {"head_loss"} == set(kernels.SLOTS)
    assert {"embedding", "linear", "attention", "residual", "rms_norm", "swiglu", "rope", "loss"} <= set(kernels.SLOTS)


def test_names_and_spellings_are_unique():
    spellings = [s for k in kernels.KERNELS.values() for s in (k.name, *k.spellings)]
    assert len(spellings) == len(set(spellings))
    assert len({k.flag for k in kernels.KERNELS.values()}) == len(kernels.KERNELS)
    assert len({(c.key, c.dtype) for c in kernels.claims()}) == len(kernels.claims())  # a key once per dtype


def test_the_docs_table_is_the_records():
    docs = (Path(__file__).resolve().parent.parent / "docs" / "kernels.md").read_text()
    start = docs.index("<!-- kernel records: python -m ckparity.kernels -->\n")
    end = docs.index("\n<!-- end of kernel records -->")
    assert docs[start:end].split("\n", 1)[1] == kernels.spine.table()


# literals that name two kernels or more outside kernels/ by design, with why
NOT_KERNEL_TABLES = {
    ("zoo/bugs.py", "BUGS"): "the zoo's planted bugs, filed by the slot each is planted in",
}


def _named_literals(path: Path, names: set[str]):
    """(assigned name, names found) of each dict/set/list/tuple literal naming two of ``names`` or more."""
    tree = ast.parse(path.read_text())
    assigned = {id(node.value): next((t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                                      if isinstance(t, ast.Name)), None)
                for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))}
    for node in ast.walk(tree):
        target = assigned.get(id(node))
        if isinstance(node, ast.Dict):
            items = node.keys
        elif isinstance(node, (ast.Set, ast.List, ast.Tuple)):
            items = node.elts
        else:
            continue
        found = [i.value for i in items if isinstance(i, ast.Constant) and i.value in names]
        if len(found) >= 2:
            yield target, found


def test_no_per_kernel_table_outside_the_records():
    """What loops over kernels loops over the records: a literal naming two kernels (or slots, or their
    spellings) outside kernels/ is a table the next kernel would have to be added to by hand."""
    names = (set(kernels.KERNELS) | set(kernels.SLOTS) | {s for k in kernels.KERNELS.values() for s in k.spellings})
    tables = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("kernels/"):
            continue
        for target, found in _named_literals(path, names):
            if target != "__all__" and (relative, target) not in NOT_KERNEL_TABLES:
                tables.append(f"{relative}: {target or 'a literal'} names {found}")
    assert tables == []
    planted = PACKAGE.parent / "planted_table.py"  # the rule can fail: a table of the kind it forbids
    try:
        planted.write_text('USED = {"rms_norm", "swiglu"}\n')
        assert list(_named_literals(planted, names)) == [("USED", ["rms_norm", "swiglu"])]
    finally:
        planted.unlink()


def test_every_gate_is_a_record_in_a_module_of_its_own():
    """A gate is one module of gates/ with its GATE record, and its line in GATE_RECORDS: no gate table
    elsewhere (settings, tiers and dtypes come from the records), and docs/harness.md's table is the records."""
    from ckparity import gates

    modules = {p.stem for p in (PACKAGE / "gates").glob("*.py")} - {"__init__", "__main__", "common", "record"}
    assert modules == set(gates.GATE_NAMES) == {g.name for g in gates.GATE_RECORDS}
    for gate in gates.GATE_RECORDS:
        assert gate.run.__module__ == f"ckparity.gates.{gate.name}" and gate.checks and gate.passes
        assert gates.DEFAULTS[gate.name] is gate.settings and set(gate.full) <= set(gate.settings)
        assert all(set(changes) <= set(gate.settings) for changes in gate.dtypes.values())
    docs = (Path(__file__).resolve().parent.parent / "docs" / "harness.md").read_text()
    start = docs.index("<!-- gate records: ckparity.gates.table() -->\n")
    end = docs.index("\n<!-- end of gate records -->")
    assert docs[start:end].split("\n", 1)[1] == gates.table()


def _one_letter_apart(a: str, b: str) -> bool:
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) == 1
    short, long = sorted((a, b), key=len)
    return len(long) - len(short) == 1 and any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def test_no_two_module_names_one_letter_apart():
    names = sorted({m.rpartition(".")[2] for m in _modules()})
    close = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if _one_letter_apart(a, b)]
    assert close == []
    assert _one_letter_apart("twin", "twins") and _one_letter_apart("build", "builds")  # what it is for


def test_no_private_name_imported_across_modules():
    imported = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("ckparity")):
                imported += [f"{module}: {a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")
                             and f"{node.module}.{a.name}".rpartition(".")[2] not in _PRIVATE_MODULES]
    assert imported == []


# modules whose names start with "_" (imported by name, as modules)
_PRIVATE_MODULES = {p.stem for p in PACKAGE.rglob("_*.py") if p.stem != "__init__"}
