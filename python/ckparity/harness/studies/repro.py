"""ckparity repro (the seed's 850-step preset under every loss backend, then
an A/B table) and ckparity compare (reports side by side, and a plot)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from ..basics.config import RunConfig
from ..basics.report import check_writable_dir, read_report
from ..loop.run import train
from ..observers.forecast import forecast_text

# The seed's 850-step drift repro: AdamW at lr 1e-3, seq-len 8, grad-accum 8.
PRESET = RunConfig(epochs=8, seq_len=8, total_tokens=131072, grad_accum=8, optimizer="adamw", lr=1e-3, seed=42,
                   max_steps=850)
# The CK v7 status notes' stress profile: the 6-byte text "Hello!" repeated to
# 4097 tokens, 16 epochs, lr 1e-3, 1000 steps: the same few windows again and
# again, so a kernel's systematic rounding bias accumulates instead of averaging out.
HELLO_TEXT = str(Path(__file__).resolve().parents[2] / "data" / "hello.txt")  # ckparity/data
STRESS = RunConfig(train_text=HELLO_TEXT, total_tokens=4097, epochs=16, seq_len=8, grad_accum=8, lr=1e-3,
                   max_steps=1000)
# The seed harness's larger "production-safe" profile (CK v7's gates).
CKV7_GATES = RunConfig(vocab=1024, d_model=256, hidden=1024, lr=5e-4, max_grad_norm=1.0, epochs=3, total_tokens=4096,
                       seq_len=8, grad_accum=8)
PRESETS = {"850": PRESET, "stress": STRESS, "ckv7-gates": CKV7_GATES}
LOSS_BACKENDS = ["c", "c_ptref", "c_fused_linear", "torch"]
AMP_LOSS_REFUSED = {"c_fused_linear"}  # no --amp form: left out of an --amp repro's default list

# The depth sweep: the stress profile's data and lr on residual models of
# growing depth, each loss backend with the C AdamW, and the "bitwise" variant
# (C rms_norm and swiglu, torch's loss and AdamW: every kernel bit-identical,
# so the whole twin must be).
DEPTH = replace(STRESS, max_steps=100)
DEPTHS = [1, 2, 6, 12, 24]
DEPTH_MODELS = ["stacked", "llama"]
DEPTH_VARIANTS = {"c": {"ck_loss_backend": "c"}, "c_ptref": {"ck_loss_backend": "c_ptref"},
                  "torch": {"ck_loss_backend": "torch"},
                  "bitwise": {"ck_loss_backend": "torch", "ck_optimizer_backend": "torch"}}


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        whole = math.isfinite(value) and value == int(value)
        return f"{value:.6g}" if whole or not math.isfinite(value) else f"{value:.3g}"
    return str(value)


# Report fields shown as they are, then the ones that need digging out.
_TOP_LEVEL = ["status", "pass_parity", "steps", "first_loss_fail_step", "first_param_fail_step",
              "first_grad_fail_step", "first_logit_fail_step", "first_moment_fail_step", "first_nonfinite_step",
              "max_loss_abs_diff", "max_param_abs_diff", "final_ck_loss", "final_torch_loss"]
ROWS = [("dtype / amp", lambda r: f"{r['config'].get('dtype', 'float32')} / {r['config'].get('amp', 'none')}")] + [
    (key, lambda r, key=key: r.get(key)) for key in _TOP_LEVEL] + [
    ("max ULP diff (loss / logit / grad / param)", lambda r: " / ".join(
        _fmt((r.get("max_ulp_diff") or {}).get(q)) for q in ("loss", "logit", "grad", "param"))),
    ("first_divergence_step", lambda r: (r.get("divergence") or {}).get("first_step")),
    ("first_divergence_stage", lambda r: (r.get("divergence") or {}).get("stage")),
    ("forecast_param_fail_step (extrapolated)", lambda r: forecast_text(r)),
    ("localized_stage", lambda r: (r["localization"] or {}).get("first_forward_stage")
        or (r["localization"] or {}).get("first_param_tensor")),
    ("localization_kind", lambda r: (r["localization"] or {}).get("kind")),
    ("closer_to_f64 (run / local)", lambda r: None if not r.get("shadow") else
        f"{r['shadow']['summary']['closer_to_f64']} / {r['shadow']['summary']['closer_to_f64_locally']}"),
    ("wall_s", lambda r: r["timing"]["wall_s"]),
    ("ck_step_ms (median)", lambda r: r["timing"]["ck_step_ms_median"]),
    ("torch_step_ms (median)", lambda r: r["timing"]["torch_step_ms_median"]),
]


def table(reports: dict[str, dict]) -> str:
    """A Markdown table, one column per report."""
    names = list(reports)
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, get in ROWS:
        lines.append(f"| {label} | " + " | ".join(_fmt(get(reports[n])) for n in names) + " |")
    return "\n".join(lines)


def repro(out_dir: str = "reports", preset: RunConfig = PRESET, name: str = "850",
          loss_backends: list[str] = LOSS_BACKENDS) -> tuple[dict[str, dict], str]:
    """The preset under each loss backend; stops after a run that was interrupted."""
    check_writable_dir(out_dir, "--out-dir")
    for backend in loss_backends:  # refused before the first run, not after
        replace(preset, ck_loss_backend=backend)
    reports = {}
    for backend in loss_backends:
        path = Path(out_dir) / f"repro_{name}_{backend}.json"
        print(f"ckparity repro: --ck-loss-backend {backend} -> {path}", flush=True)
        reports[backend] = train(replace(preset, ck_loss_backend=backend, json_out=str(path)))
        if reports[backend]["status"] == "interrupted":
            break
    return reports, table(reports)


def depth_sweep(out_dir: str, preset: RunConfig = DEPTH, depths: list[int] = DEPTHS,
                variants: dict[str, dict] = DEPTH_VARIANTS, models: list[str] = DEPTH_MODELS) -> tuple[list[dict], str]:
    """One run per model, depth and variant; rows for the table (and the depth gate)."""
    check_writable_dir(out_dir, "--out-dir")
    rows = []
    for model, depth, (name, overrides) in ((m, d, v) for m in models for d in depths for v in variants.items()):
        path = Path(out_dir) / f"depth_{model}_L{depth}_{name}.json"
        r = train(replace(preset, model=model, num_layers=depth, json_out=str(path), **overrides))
        rows.append({"model": model, "layers": depth, "variant": name, "status": r["status"],
                     "first_param_fail_step": r["first_param_fail_step"],
                     "first_loss_fail_step": r["first_loss_fail_step"],
                     "max_param_abs_diff": r["max_param_abs_diff"],
                     "bitwise": r["divergence"]["first_step"] is None,
                     "first_divergence_stage": r["divergence"]["stage"], "wall_s": r["timing"]["wall_s"]})
        if r["status"] == "interrupted":
            break
    return rows, depth_table(rows)


def depth_table(rows: list[dict]) -> str:
    lines = ["| model | L | variant | status | first param fail | first loss fail | max param diff | bitwise "
             "| first divergence | wall s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['layers']} | {r['variant']} | {r['status']} | "
                     f"{_fmt(r['first_param_fail_step'])} | {_fmt(r['first_loss_fail_step'])} | "
                     f"{_fmt(r['max_param_abs_diff'])} | {_fmt(r['bitwise'])} | {_fmt(r['first_divergence_stage'])} | "
                     f"{r['wall_s']:.1f} |")
    return "\n".join(lines)


def compare(paths: list[str]) -> tuple[dict[str, dict], str]:
    """The reports by file name, and their table."""
    reports = {Path(p).stem: read_report(p) for p in paths}
    return reports, table(reports)
