"""What a person looks at for drift reports (train, repro, compare): the
differences per quantity over steps -- the difference itself on a log axis,
not two overlaid curves that hide it -- with the first step each quantity
left tolerance (dashed), the first differing bit (dotted), each tolerance and,
where the run measured it, the noise envelope's band (the largest difference
of its perturbed members); then the stage and kernel where the twins first
part, and repro's table. ``compare --plot`` saves the figure alone."""

from __future__ import annotations

import math

from ..basics import html
from .repro import table

QUANTITIES = ("loss", "logit", "grad", "param", "moment")
FLOOR = 1e-12  # a zero difference cannot sit on a log axis: drawn here, and said so


def figure(reports: dict[str, dict]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [q for q in QUANTITIES if any(f"{q}_abs_diff" in r["series"] for r in reports.values())]
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 2.3 * len(shown) + 1), sharex=True, squeeze=False)
    for ax, q in zip(axes[:, 0], shown):
        drawn = set()
        for k, (name, r) in enumerate(reports.items()):
            series, color = r["series"], f"C{k}"
            values = [max(v, FLOOR) if isinstance(v, (int, float)) and math.isfinite(v) else float("nan")
                      for v in series.get(f"{q}_abs_diff", [])]
            ax.plot(series["step"][:len(values)], values, label=name, linewidth=1, color=color)
            band = ((r.get("envelope") or {}).get("series") or {})
            if f"{q}_max" in band:
                ax.fill_between(band["step"], FLOOR, [max(v, FLOOR) for v in band[f"{q}_max"]], color=color,
                                alpha=0.15, label=f"{name}: noise envelope")
            fail = r.get(f"first_{q}_fail_step")
            if fail is not None:
                ax.axvline(fail, color=color, linestyle="--", linewidth=0.9, label=f"{name}: first {q} fail {fail}")
            bit = (r.get("divergence") or {}).get("first_step")
            if bit is not None:
                ax.axvline(bit, color=color, linestyle=":", linewidth=0.9)
            tol = (r.get("tolerances") or {}).get(f"{q}_tol")
            if tol is not None and tol not in drawn:  # each run's own (a bf16 run's are wider)
                drawn.add(tol)
                ax.axhline(tol, color=color if len(reports) > 1 else "grey", linestyle="-.", linewidth=0.8,
                           label=f"{q}_tol {tol:g}")
        ax.set_yscale("log")
        ax.set_ylabel(f"|{q} difference|")
        ax.legend(fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel(f"step (a difference of 0 is drawn at {FLOOR:g}; dotted: first differing bits)")
    fig.suptitle("ckparity drift: CK twin minus torch twin, per quantity")
    fig.tight_layout()
    return fig


def plot(reports: dict[str, dict], out: str) -> None:
    import matplotlib.pyplot as plt

    fig = figure(reports)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _parting(name: str, r: dict) -> str:
    d = r.get("divergence") or {}
    where = ("bit-identical throughout" if d.get("first_step") is None else
             f"first differing bits at step {d['first_step']}" + "".join(
                 f", {key} {d[key]}" for key in ("stage", "kernel", "tensor") if d.get(key) is not None))
    fails = ", ".join(f"{q} at step {r[f'first_{q}_fail_step']}" for q in QUANTITIES
                      if r.get(f"first_{q}_fail_step") is not None) or "none"
    return html.verdict(r.get("status") == "pass", f"{name}: {r.get('status')} after {r.get('steps')} steps; "
                                                    f"first fails: {fails}; {where}")


def page(reports: dict[str, dict], title: str) -> str:
    import matplotlib.pyplot as plt

    fig = figure(reports)
    try:
        image = html.png(fig)
    finally:
        plt.close(fig)
    return html.page(title, *(_parting(n, r) for n, r in reports.items()), image, html.markdown_table(table(reports)))
