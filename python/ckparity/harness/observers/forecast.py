"""When will the drift cross param-tol? A forecast from the start of a run.

The max |param difference| of a run (its running maximum: the envelope of
the drift) is fitted over the steps from the first bitwise divergence to the
end of the first ``FRACTION`` of the planned steps, as two models in log
space — exponential growth (log d linear in the step) and a power law (log d
linear in log of the steps since the divergence) — and the one with the
smaller residual is extrapolated to the step where it reaches param-tol. A
short CI run can so warn about a long one. The forecast states its model
and fit window; with too few points, no growth, or a crossing already inside
the window, it says why instead of a step."""

from __future__ import annotations

import math

FRACTION = 0.3
MIN_POINTS = 5


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x; returns (a, b, residual sum of squares)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    a = my - b * mx
    return a, b, sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))


def forecast(steps: list[int], param_diffs: list[float], tol: float, planned_steps: int,
             first_divergence: int | None) -> dict:
    end = max(1, int(FRACTION * planned_steps))
    result = {"param_fail_step": None, "model": None, "fit_steps": None, "reason": None, "fraction": FRACTION}
    if first_divergence is None:
        return {**result, "reason": "the twins never differed"}
    envelope, points = 0.0, []
    for step, d in zip(steps, param_diffs):
        if step > end:
            break
        envelope = max(envelope, d if math.isfinite(d) else math.inf)
        if step >= first_divergence and 0 < envelope < math.inf:
            points.append((step, envelope))
    if any(d > tol for _, d in points):
        return {**result, "reason": f"param-tol was crossed within the fit window (steps <= {end})"}
    if len(points) < MIN_POINTS:
        return {**result, "reason": f"{len(points)} points with a difference in steps <= {end} (need {MIN_POINTS})"}
    s0 = points[0][0]
    logs = [math.log(d) for _, d in points]
    models = {"exponential": [float(s) for s, _ in points], "power": [math.log(s - s0 + 1) for s, _ in points]}
    fits = {name: _fit(xs, logs) for name, xs in models.items()}
    name = min(fits, key=lambda m: fits[m][2])
    a, b, _ = fits[name]
    result.update(model=name, fit_steps=[points[0][0], points[-1][0]], growth=b)
    if b <= 0:
        return {**result, "reason": "the drift does not grow over the fit window"}
    x = (math.log(tol) - a) / b
    step = x if name == "exponential" else s0 - 1 + math.exp(min(x, 700.0))
    result["param_fail_step"] = int(math.ceil(step)) if step < 1e12 else None
    if result["param_fail_step"] is None:
        result["reason"] = "the fitted growth never reaches param-tol within 1e12 steps"
    return result


def forecast_text(r: dict) -> str | None:
    """The forecast as what it is: a straight-line extrapolation, said as far past the run as it lies (the
    850-step repro's 26361249495 is 3e7 runs away: no run measured it)."""
    step, steps = r.get("forecast_param_fail_step"), r.get("steps") or 0
    if step is None:
        return None
    if steps and step > 10 * steps:
        return f"~{step:.2g}: a forecast {step / steps:.2g}x past this run's {steps} steps, not a measurement"
    return f"{step} (forecast, not measured)"
