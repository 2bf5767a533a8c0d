"""What observes a step of the loop and keeps what the report needs:
``drift`` (the per-step comparison, series, first fails, non-finite steps,
the localizer and the divergence tracer), ``localize`` (the replay of a
window through both twins), ``shadow`` (float64), ``forecast``,
``envelope`` (--envelope), ``spikes`` (--spike-triage)."""
