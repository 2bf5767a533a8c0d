"""The ckparity command line.

  ckparity train    the harness: CK twin vs torch twin, a drift report
  ckparity repro    a preset (850, stress) under each loss backend, and an A/B table
  ckparity attribute  an ablation over the backends: which kernel makes the run fail
  ckparity compare  reports side by side, and a drift plot
  ckparity gate     the CI parity gates (--tier quick|full, --only, --config gates.toml)
  ckparity bench    kernel speed against torch and against a copy's bandwidth
  ckparity mutate   the gates against builds with planted numerics bugs: a kill matrix
  ckparity check    the conformance suite on any backend of a kernel (yours: --plugin)
  ckparity replay   recompute a step dumped by train --dump-step (CK, torch, float64)
  ckparity zoo      real-world bug classes planted through the plugin door: caught? vs the peers' criteria
  ckparity info     versions, threads, the loaded library

Exit codes: 0 pass, 1 parity fail (or a run that stopped with an error),
2 usage or input error (before any work), 3 the report could not be written
where asked (it went to the fallback path named on stderr), 130/143/129
interrupted by SIGINT/SIGTERM/SIGHUP (the report is written)."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from pathlib import Path
from dataclasses import replace

from . import kernels
from .harness.basics.config import dtype_name
from .harness.basics.interrupts import EXIT_FAIL, EXIT_NOT_RECORDED, EXIT_PASS, EXIT_USAGE, exit_code  # noqa: F401


def _parser(**kwargs) -> argparse.ArgumentParser:
    """A command's parser, with --plugin in its --help."""
    from .harness.basics.config import add_plugin_argument

    parser = argparse.ArgumentParser(**kwargs)
    add_plugin_argument(parser)
    return parser


def _train(argv: list[str]) -> int:
    from .harness.basics.config import given_fields, parse_train_args
    from .harness.basics.report import STDOUT, check_writable
    from .harness.ranks.launch import launch
    from .harness.twins.ranked import RANK_ENV
    from .harness.loop.run import DEFAULT_JSON_OUT, train

    config, own = parse_train_args(argv, extra={"--html": HTML_FLAG})
    if own["html"]:
        check_writable(own["html"], "--html")
    if config.resume:  # the checkpoint's config says whether the run has ranks
        from .harness.longrun.checkpoint import resume_config

        config = resume_config(config, given_fields(argv))
    # --tp/--dp: start the ranks here, unless torchrun already did
    distributed = config.tp * config.dp > 1 and not any(name in os.environ for name in RANK_ENV)
    isolated = _users_backends_isolated(config, distributed)
    result = launch(config) if distributed else isolated(config) if isolated else train(config)
    if os.environ.get("RANK", "0") != "0":  # under torchrun: rank 0 speaks for the run
        return exit_code(result)
    path = result["config"]["json_out"] or DEFAULT_JSON_OUT
    if own["html"]:  # an interrupted or failed run's too: what ran
        _write_drift_page(own["html"], {Path(path).stem if path != STDOUT else "run": result}, "ckparity train")
    # with --json-out -, stdout carries the report alone
    out = sys.stderr if path == STDOUT else sys.stdout
    print(f"ckparity train: {result['status']} after {result['steps']} steps "
          f"(first loss fail: {result['first_loss_fail_step']}, first param fail: {result['first_param_fail_step']}, "
          f"max |loss diff| {result['max_loss_abs_diff']}) -> {path}", file=out)
    envelope = result.get("envelope")
    if envelope:
        reasons = ([f"by size from step {envelope['first_beyond_step']}"] if envelope["first_beyond_step"] else []) + \
                  ([f"directed: {', '.join(envelope['directed'])}"] if envelope["directed"] else [])
        print(f"ckparity train: {envelope['verdict']}" + (f" ({'; '.join(reasons)})" if reasons else ""), file=out)
    if result.get("failed_by_bitwise"):
        where = result["divergence"] or {}
        print(f"ckparity train: not bit-identical (--expect-bitwise): first differing bits at step "
              f"{where.get('first_step')}, stage {where.get('stage')}, tensor {where.get('tensor')}", file=out)
        hint = _threads_hint(result)
        if hint:
            print(f"ckparity train: {hint}", file=out)
    if result["error"]:
        print(f"ckparity train: stopped by {result['error']}", file=sys.stderr)
    mismatch = (result["ranks"] or {}).get("first_rank_mismatch_step")
    if mismatch is not None:
        print(f"ckparity train: stopped at step {mismatch}: the ranks' replicated parameters differ", file=sys.stderr)
    return exit_code(result)


def _threads_hint(result: dict) -> str | None:
    """Why a C linear or attention may differ with torch at several threads, and what fixes it: MKL splits some
    GEMMs' K between its threads, an order not followed, unless MKL_CBWR=AUTO,STRICT gives one order at every
    thread count (csrc/linear.c's [Note: MKL's strict order])."""
    env, config = result.get("env") or {}, result["config"]
    if env.get("torch_threads", 1) < 2 or env.get("mkl_strict") or "c" not in (
            config.get("ck_linear_backend"), config.get("ck_attention_backend")):
        return None
    return (f"torch ran at {env['torch_threads']} threads, where MKL splits some GEMMs' K between them (an order "
            "not followed); start the run with MKL_CBWR=AUTO,STRICT for one order at every thread count, or use "
            "--torch-threads 1")


HTML_FLAG = {"default": None, "metavar": "FILE",
             "help": "also write one self-contained HTML page (plots embedded, no network) of what ran"}


def _write_drift_page(path: str, reports: dict, title: str) -> None:
    from .harness.basics.report import write_text
    from .harness.studies import drift_page

    write_text(path, drift_page.page(reports, title))


def _write_page(path: str, title: str, passed: bool, line: str, markdown: str) -> None:
    from .harness.basics import html
    from .harness.basics.report import write_text

    write_text(path, html.page(title, html.verdict(passed, line), html.markdown_table(markdown)))


def _users_backends_isolated(config, distributed: bool):
    """How a run with a user's backend is trained so that a segfault, an abort or a kill in it is a
    report, not a core dump: in a child process that keeps its place (loop/child.train_isolated); None
    for a run of ckparity's and torch's backends alone, a --tp/--dp one (its ranks are processes already),
    a report on stdout, or a backend only this process can reach (said on stderr)."""
    from .harness.loop import child
    from .harness.basics.report import STDOUT
    from .harness.loop.run import DEFAULT_JSON_OUT

    users = child.users_backends(config)
    if not users or distributed or config.json_out == STDOUT:
        return None
    carry = child.carry_for(config)
    if carry is None:
        print(f"ckparity train: {', '.join(users)} can only be reached in this process: a crash in it ends the "
              "run without a report", file=sys.stderr)
        return None
    json_out = config.json_out or DEFAULT_JSON_OUT
    return lambda c: child.train_isolated(replace(c, json_out=json_out), carry)


def _repro(argv: list[str]) -> int:
    from .harness.basics.config import UsageError
    from .harness.basics.report import check_writable
    from .harness.studies.repro import AMP_LOSS_REFUSED, DEPTH, LOSS_BACKENDS, PRESETS, depth_sweep, repro

    parser = _parser(prog="ckparity repro", description="A preset run with --ck-loss-backend "
                                     f"{', '.join(LOSS_BACKENDS)}, then an A/B table. 850: the seed's 850-step repro; "
                                     "stress: the text 'Hello!' repeated, lr 1e-3, 1000 steps; ckv7-gates: the "
                                     "seed's larger profile; depth: residual models of 1..24 layers, 100 steps.")
    parser.add_argument("--preset", choices=sorted(PRESETS) + ["depth"], default="850")
    parser.add_argument("--out-dir", default="reports")
    parser.add_argument("--html", **HTML_FLAG)
    parser.add_argument("--max-steps", type=int, default=None, help="shorten the preset")
    parser.add_argument("--f64-shadow", action="store_true", help="add the float64 shadow to each run")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", type=dtype_name,
                        help="both twins' dtype (bfloat16: pure bf16; reports repro_NAME_bfloat16_BACKEND.json)")
    parser.add_argument("--amp", choices=["none", "bfloat16"], default="none", type=dtype_name,
                        help="mixed precision: float32 masters, the forward under autocast (reports "
                             "repro_NAME_amp_BACKEND.json)")
    parser.add_argument("--loss-backends", nargs="+", metavar="NAME", default=None,
                        help=f"the loss backends to run (default {' '.join(LOSS_BACKENDS)}, under --amp "
                             f"{' '.join(b for b in LOSS_BACKENDS if b not in AMP_LOSS_REFUSED)}; yours with --plugin)")
    flags = {flag: kernel for flag, kernel in kernels.FLAGS.items() if kernel != "cross_entropy"}
    for flag, kernel in flags.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", default=None, metavar="NAME",
                            help=f"the CK twin's {kernel} in every run (one of {kernels.registered(kernel)})")
    args = parser.parse_args(argv)
    if args.html:
        check_writable(args.html, "--html")
    preset = DEPTH if args.preset == "depth" else PRESETS[args.preset]
    chosen = {flag: getattr(args, flag) for flag in flags if getattr(args, flag) is not None}
    if args.preset == "depth" and args.loss_backends:
        raise UsageError("--loss-backends takes no effect with --preset depth (its variants choose the loss)")
    preset = replace(preset, **chosen, **({"max_steps": args.max_steps} if args.max_steps is not None else {}),
                     **({"f64_shadow": True} if args.f64_shadow else {}), dtype=args.dtype, amp=args.amp)
    if args.preset == "depth":
        rows, text = depth_sweep(args.out_dir, preset)
        print(text)
        if args.html:
            _write_page(args.html, "ckparity repro --preset depth", all(r["status"] == "pass" for r in rows),
                        f"{sum(r['status'] == 'pass' for r in rows)} of {len(rows)} runs pass", text)
        return max(exit_code(r) for r in rows)
    backends = args.loss_backends or [b for b in LOSS_BACKENDS
                                      if preset.amp == "none" or b not in AMP_LOSS_REFUSED]
    name = args.preset + {"float32": "", "bfloat16": "_bfloat16"}[args.dtype] + ("_amp" if args.amp != "none" else "")
    reports, text = repro(args.out_dir, preset, name, backends)
    print(text)
    if args.html:
        _write_drift_page(args.html, reports, f"ckparity repro --preset {name}")
    return max(exit_code(r) for r in reports.values())


def _attribute(argv: list[str]) -> int:
    import os

    from .harness.studies.attribute import attribute, table
    from .harness.basics.config import UsageError, parse_train_args

    config, own = parse_train_args(argv, prog="ckparity attribute", extra={
        "--jobs": {"type": int, "default": os.cpu_count() or 1, "help": "variants run at once (default: cores)"}})
    if own["jobs"] < 1:
        raise UsageError(f"--jobs must be >= 1, got {own['jobs']}")
    json_out = config.json_out or "reports/attribute_latest.json"
    result = attribute(config, json_out, own["jobs"])
    print(table(result), file=sys.stderr if json_out == "-" else sys.stdout)
    if result["status"] == "interrupted":
        return exit_code({"status": "interrupted", **result})
    # as train would for the configured run: 0 only where it passes (the ablation is the explanation)
    configured = next((v for v in result["variants"] if v["name"] == "as configured"), {"status": "error"})
    return exit_code({"status": configured["status"], "error": None})


def _compare(argv: list[str]) -> int:
    from .harness.basics.config import UsageError
    from .harness.basics.report import check_writable, check_writable_dir
    from .harness.studies import drift_page
    from .harness.studies.repro import compare

    parser = _parser(prog="ckparity compare")
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--plot", default=None, help="write a PNG of the differences per step")
    parser.add_argument("--html", **HTML_FLAG)
    args = parser.parse_args(argv)
    if args.plot:
        check_writable_dir(Path(args.plot).parent, "--plot")
    if args.html:
        check_writable(args.html, "--html")
    try:
        reports, text = compare(args.reports)
    except (OSError, ValueError, KeyError) as err:
        raise UsageError(f"cannot compare: {err}") from None
    print(text)
    if args.plot:
        drift_page.plot(reports, args.plot)
    if args.html:
        _write_drift_page(args.html, reports, "ckparity compare")
    return EXIT_PASS


def _backend_choices(specs: list[str]) -> dict[str, str]:
    """--backend SLOT=NAME ... -> {slot: name}, each slot and backend known."""

    chosen = {}
    for spec in specs:
        kernel, sep, name = spec.partition("=")
        if not sep or not name:
            raise ValueError(f"--backend takes SLOT=NAME (e.g. swiglu=mine), got {spec!r}")
        kernel = kernels.slot(kernel)
        kernels.resolve(kernel, name)
        if chosen.get(kernel, name) != name:
            raise ValueError(f"--backend gives {kernel} twice: {chosen[kernel]!r} and {name!r}")
        chosen[kernel] = name
    return chosen


def _gate(argv: list[str]) -> int:
    from .gates import DTYPE_GATES, GATE_NAMES, HANG_TIMEOUT, junit_cases, markdown_summary, run_gates, settings_for
    from .harness.basics import junit
    from .harness.basics.config import UsageError
    from .harness.basics.report import check_writable, check_writable_dir, write_text

    parser = _parser(prog="ckparity gate", description="Runs the parity gates; exits 1 if any fails.")
    parser.add_argument("--tier", choices=["quick", "full"], default="quick")
    parser.add_argument("--only", nargs="+", choices=GATE_NAMES, metavar="GATE", help=f"among {GATE_NAMES}")
    parser.add_argument("--config", default=None, help="TOML file overriding gate settings")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", type=dtype_name,
                        help=f"run the gates that take a dtype ({', '.join(DTYPE_GATES)}) in it: bfloat16 holds the "
                             "kernels, the optimizer and the twins to torch's bf16 eager (default out dir "
                             "reports/gates/bfloat16)")
    parser.add_argument("--out-dir", default=None, help="where the reports go (default reports/gates)")
    parser.add_argument("--backend", action="append", default=[], metavar="SLOT=NAME",
                        help="run the gates with this registered backend in the CK twin (repeatable; load it with "
                             "--plugin); kernel_parity runs `ckparity check` on it, optimizer_parity holds an adamw "
                             "or clip_grad_norm one to torch")
    parser.add_argument("--fail-fast", action="store_true", help="stop after the first gate that fails")
    parser.add_argument("--hang-timeout", type=float, default=HANG_TIMEOUT, metavar="SECONDS",
                        help=f"with --backend: a gate's process or run that calls no slot for this long is killed "
                             f"as hung, the gate failing (default {HANG_TIMEOUT:g}; 0 waits forever)")
    parser.add_argument("--junit", default=None, help="JUnit XML: a test case per gate, failing where it fails")
    parser.add_argument("--html", **HTML_FLAG)
    args = parser.parse_args(argv)
    try:
        settings = settings_for(args.tier, args.config, args.dtype)
        ck_backends = _backend_choices(args.backend)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if not (args.hang_timeout >= 0 and math.isfinite(args.hang_timeout)):
        raise UsageError(f"--hang-timeout must be finite and >= 0 (0: wait forever), got {args.hang_timeout}")
    names = args.only or (GATE_NAMES if args.dtype == "float32" else DTYPE_GATES)
    if args.dtype != "float32" and set(names) - set(DTYPE_GATES):
        raise UsageError(f"--dtype {args.dtype}: {', '.join(sorted(set(names) - set(DTYPE_GATES)))} run in float32 "
                         f"only; the gates that take a dtype: {', '.join(DTYPE_GATES)}")
    out_dir = args.out_dir or ("reports/gates" + ("" if args.dtype == "float32" else f"/{args.dtype}"))
    check_writable_dir(out_dir, "--out-dir")
    for path, flag in ((args.junit, "--junit"), (args.html, "--html")):
        if path:
            check_writable(path, flag)
    tier = args.tier + ("" if args.dtype == "float32" else f", {args.dtype}")
    results = run_gates(names, settings, Path(out_dir), tier, ck_backends=ck_backends, fail_fast=args.fail_fast,
                        hang_timeout=args.hang_timeout)
    if args.junit:  # an interrupted run's too: the gates that ran, the stopped one failing
        write_text(args.junit, junit.xml("ckparity gate", junit_cases(results)))
    if args.html:
        _write_page(args.html, f"ckparity gate ({tier})", all(r["passed"] for r in results),
                    f"{sum(r['passed'] for r in results)} of {len(results)} gates passed",
                    markdown_summary(results, tier))
    failed = [r["gate"] for r in results if not r["passed"]]
    print(f"ckparity gate: {len(results) - len(failed)}/{len(results)} passed"
          + (f"; failed: {', '.join(failed)}" if failed else "") + f" (summary: {out_dir}/summary.md)")
    stopped = [r["details"]["interrupted"] for r in results if r["details"].get("interrupted")]
    if stopped:
        from .harness.basics.interrupts import EXIT_CODES

        return EXIT_CODES.get(stopped[0], 130)
    return EXIT_FAIL if failed else EXIT_PASS


def _bench(argv: list[str]) -> int:
    from .bench import bench, row_kernels, selected, table
    from .harness.basics.config import UsageError
    from .harness.basics.report import check_writable, write_json

    parser = _parser(prog="ckparity bench")
    parser.add_argument("--json-out", default="reports/bench_latest.json")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile column (compiling takes "
                        "minutes on a small machine)")
    parser.add_argument("--no-distributed", action="store_true", help="skip the vocab-parallel row (two gloo ranks)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory columns and the fused "
                        "linear + cross-entropy row (fresh processes; the fused row takes minutes)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", type=dtype_name,
                        help="the rows of this dtype (bfloat16: the kernels torch's bf16 eager is matched for)")
    names = row_kernels()
    parser.add_argument("--kernel", action="append", choices=names, metavar="NAME",
                        help=f"only this kernel's rows (repeatable; default: every row). One of: {', '.join(names)}")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    if args.kernel and not selected(args.dtype, args.kernel, memory=not args.no_memory, distributed=not args.no_distributed):
        raise UsageError(f"no {args.dtype} row of {', '.join(args.kernel)} runs with these options "
                         f"(the fused row needs the memory columns, the vocab-parallel one ranks and float32)")
    check_writable(args.json_out, "--json-out")
    data = bench(args.repeats, compile=not args.no_compile, distributed=not args.no_distributed,
                 memory=not args.no_memory, dtype=args.dtype, kernels=args.kernel)
    write_json(args.json_out, data)
    print(table(data), file=sys.stderr if args.json_out == "-" else sys.stdout)
    return EXIT_PASS


def _mutate(argv: list[str]) -> int:
    from .gates import GATE_NAMES
    from .harness.basics.config import UsageError
    from .harness.basics.report import check_writable, check_writable_dir, write_json
    from .mutate import check_tools, find_source, mutate, table

    parser = _parser(prog="ckparity mutate", description="Builds the C library with each planted "
                                     "numerics bug (csrc/mutants.h), runs the gates against each, writes the kill "
                                     "matrix; exits 1 if the score is below --min-score or the control build fails.")
    parser.add_argument("--tier", choices=["quick", "full"], default="quick")
    parser.add_argument("--gates", nargs="+", choices=GATE_NAMES, metavar="GATE", default=GATE_NAMES,
                        help=f"among {GATE_NAMES} (default: all)")
    parser.add_argument("--mutants", nargs="+", metavar="NAME", help="only these (default: the whole catalogue)")
    parser.add_argument("--source", default=None, help="the ckparity checkout to build (default: found from here up)")
    parser.add_argument("--build-dir", default=None, help="scratch build directories (default: SOURCE/build/mutants)")
    parser.add_argument("--out-dir", default="reports/mutate", help="each build's gate reports")
    parser.add_argument("--json-out", default="reports/mutate_latest.json")
    parser.add_argument("--min-score", type=float, default=0.95)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per build's gate run")
    parser.add_argument("--matrix", action="store_true", help="every gate on every mutant (the full kill matrix; "
                        "the full tier's default); else each mutant's gates run cheapest first and stop at its "
                        "first kill: the score and each mutant's cheapest killer, in less time")
    args = parser.parse_args(argv)
    try:
        source = find_source(Path(args.source or ".").resolve(), search_up=args.source is None)
        check_tools()
    except FileNotFoundError as err:
        raise UsageError(str(err)) from None
    if not 0.0 <= args.min_score <= 1.0 or args.timeout <= 0:
        raise UsageError("--min-score must be in [0, 1] and --timeout positive")
    check_writable(args.json_out, "--json-out")
    check_writable_dir(args.out_dir, "--out-dir")
    build_root = Path(args.build_dir) if args.build_dir else source / "build" / "mutants"
    from .harness.basics.interrupts import EXIT_CODES, stop_on_signals

    # SIGTERM and SIGHUP end the run as Ctrl-C does: with the report of what
    # was measured (a signal while it is written is held, then acted on)
    with stop_on_signals() as stop:
        try:
            report = mutate(source, build_root.resolve(), Path(args.out_dir).resolve(), args.tier, args.gates,
                            args.mutants, args.timeout, matrix=args.matrix or args.tier == "full")
        except ValueError as err:
            raise UsageError(str(err)) from None
        finally:
            stop.hold()
        report["interrupted"] = report["interrupted"] or stop.signum is not None
        write_json(args.json_out, report)
    print(table(report))
    if report["interrupted"]:
        return EXIT_CODES.get(stop.signum, 130)
    return EXIT_FAIL if report["error"] or (report["score"] or 0.0) < args.min_score else EXIT_PASS


def _check(argv: list[str]) -> int:
    from .check import DEFAULT_TIMEOUT, CheckSetupError, covered, isolated_check, table
    from .check.suite import junit_cases
    from .harness.basics.interrupts import EXIT_CODES, Interrupted, stop_on_signals
    from .harness.basics.config import UsageError
    from .harness.basics.report import STDOUT, check_writable

    parser = _parser(prog="ckparity check", description="The conformance suite ckparity runs on its "
                                     "own kernels, on any registered backend (--plugin loads yours): widths 1..300 "
                                     "and large odd ones against torch and float64, the slot's options, strided "
                                     "input, 1 and 2 threads, bad input, cheats. With no kernel named: every "
                                     "backend the plugins register (or --all), one table with each one's speed "
                                     "against torch eager. Exit 0 unless a verdict is wrong or crashes.")
    spellings = sorted(s for name in covered() for s in kernels.KERNELS[name].spellings)
    parser.add_argument("kernel", nargs="?", default=None,
                        help=f"one of {covered()} (or the flags' spelling: {', '.join(spellings)}); none: the "
                             "whole engine")
    parser.add_argument("--backend", default=None, help="a registered backend, or module:attr (with a kernel)")
    parser.add_argument("--all", action="store_true",
                        help="with no kernel: every backend of every slot but torch's, ckparity's own included")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", type=dtype_name,
                        help="the cases' dtype: bfloat16 holds the backend to torch's bf16 eager (bf16 ULPs)")
    parser.add_argument("--json-out", default=None, help="the report (schema ckparity.check/1, or "
                                                         "ckparity.check-engine/1 for an engine); - for stdout")
    parser.add_argument("--junit", default=None, help="JUnit XML: a test case per property (per slot's property "
                                                      "for an engine), a failing one where check fails")
    parser.add_argument("--html", **HTML_FLAG)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds each suite may run before its process is killed and the verdict is crashes "
                             f"(default {DEFAULT_TIMEOUT:g})")
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be > 0, got {args.timeout}")
    if args.kernel is None and args.backend is not None:
        raise UsageError("--backend names one backend of a kernel: name the kernel too, or leave both out to "
                         "check every backend the plugins register")
    if args.kernel is not None and (args.backend is None or args.all):
        raise UsageError("a kernel is checked on one --backend (--all is for the whole engine: no kernel)")
    for path, flag in ((args.json_out, "--json-out"), (args.junit, "--junit"), (args.html, "--html")):
        if path:
            check_writable(path, flag)
    if args.kernel is None:
        return _check_engine(args)
    try:
        # the plugins load in the child only (_load_plugins): a backend that crashes at registration or in
        # its contract check is a verdict there, not a dead command here
        with stop_on_signals():  # SIGTERM/SIGHUP end the child too (isolated_check kills it)
            report = isolated_check(args.kernel, args.backend, timeout=args.timeout, dtype=args.dtype)
    except CheckSetupError as err:
        raise UsageError(str(err)) from None
    except (ValueError, KeyError) as err:
        raise UsageError(str(err).strip("'\"")) from None
    except Interrupted as stopped:  # the report of what ran, its last property "interrupted"
        report = stopped.report
        _write_check(args, report, junit_cases([report]), table(report))
        print(table(report), file=sys.stderr)
        return EXIT_CODES[stopped.signum]
    _write_check(args, report, junit_cases([report]), table(report))
    print(table(report), file=sys.stderr if args.json_out == STDOUT else sys.stdout)
    return EXIT_PASS if report["passed"] else EXIT_FAIL


def _check_engine(args) -> int:
    from .check import CheckSetupError, engine
    from .check.suite import junit_cases
    from .harness.basics.config import UsageError
    from .harness.basics.interrupts import EXIT_CODES, Interrupted, stop_on_signals
    from .harness.basics.report import STDOUT

    try:
        with stop_on_signals():
            pairs = engine.backends_to_check(args.all)
            report = engine.check_engine(pairs, args.dtype, args.timeout,
                                         progress=lambda line: print(line, file=sys.stderr, flush=True))
    except CheckSetupError as err:
        raise UsageError(str(err)) from None
    except Interrupted as stopped:  # the slots checked so far, the one stopped in last
        _write_check(args, stopped.report, junit_cases(stopped.report["checks"]), engine.table(stopped.report))
        print(engine.table(stopped.report), file=sys.stderr)
        return EXIT_CODES[stopped.signum]
    _write_check(args, report, junit_cases(report["checks"]), engine.table(report))
    print(engine.table(report), file=sys.stderr if args.json_out == STDOUT else sys.stdout)
    return EXIT_PASS if report["passed"] else EXIT_FAIL


def _write_check(args, report: dict, cases, text: str) -> None:
    """check's files: the JSON, JUnit (a case per property) and the page (its table, first line the verdict)."""
    from .harness.basics import junit
    from .harness.basics.report import write_json, write_text

    if args.json_out:
        write_json(args.json_out, report)
    if args.junit:
        write_text(args.junit, junit.xml("ckparity check", cases))
    if args.html:
        title, _, rest = text.partition("\n")
        _write_page(args.html, "ckparity check", report["passed"], title, rest)


def _replay(argv: list[str]) -> int:
    from .harness.longrun.dump import replay
    from .harness.basics.report import STDOUT, check_writable, write_json

    parser = _parser(prog="ckparity replay", description="Recomputes a step dumped by ckparity train "
                                     "--dump-step N: CK and torch each from its own state, and each in float64; "
                                     "prints the per-stage differences (the divergence tracer's rows).")
    parser.add_argument("dump_dir")
    parser.add_argument("--json-out", default=None, help="the rows as JSON (schema ckparity.dump/1); - for stdout")
    args = parser.parse_args(argv)
    if args.json_out:
        check_writable(args.json_out, "--json-out")
    result = replay(args.dump_dir)
    if args.json_out:
        write_json(args.json_out, result)
    out = sys.stderr if args.json_out == STDOUT else sys.stdout
    print(f"ckparity replay {args.dump_dir}: step {result['step']}, the recomputation "
          f"{'repeats' if result['faithful'] else 'does NOT repeat'} the dumped bits", file=out)
    print("| stage | CK vs torch | CK vs float64 | torch vs float64 |", file=out)
    print("|---|---|---|---|", file=out)
    for part in ("forward", "backward"):
        for a, b, c in zip(*(result[k][part] for k in ("ck_vs_torch", "ck_vs_float64", "torch_vs_float64"))):
            print(f"| {a['stage']} | {a['abs_diff']:.3g} | {b['abs_diff']:.3g} | {c['abs_diff']:.3g} |", file=out)
    return EXIT_PASS if result["faithful"] else EXIT_FAIL


def _info(argv: list[str]) -> int:
    _parser(prog="ckparity info",
                            description="The environment a report records, and what is bit-identical to torch "
                                        "at the CPU capability torch runs at here.").parse_args(argv)
    from .harness.loop.run import environment

    print(json.dumps({**environment(), "bit_identical": kernels.bit_identical(),
                      "bit_identical_bfloat16": kernels.bit_identical("bfloat16"),
                      "bit_identical_float16": kernels.bit_identical("float16"),
                      "not_bit_identical": kernels.not_bit_identical()}, indent=2))
    return EXIT_PASS


def _zoo(argv: list[str]) -> int:
    from .harness.basics.config import UsageError
    from .harness.basics.report import check_writable
    from .zoo.scenarios import BY_NAME

    parser = _parser(prog="ckparity zoo", description="Bug classes people ship, each planted through the plugin "
                     "door; ckparity's tools on each, and the peers' criteria on the same runs (docs/zoo.md)")
    parser.add_argument("--only", nargs="+", default=[], metavar="SCENARIO", help=f"these scenarios: {', '.join(BY_NAME)}")
    parser.add_argument("--steps", type=int, default=300, help="steps of each run (default 300)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds of the control run without a bug (default 5; 0: none)")
    parser.add_argument("--jobs", type=int, default=2, help="attribute's parallel variants (default 2)")
    parser.add_argument("--out-dir", default="reports/zoo", help="the runs' reports (default reports/zoo)")
    parser.add_argument("--json-out", default="reports/zoo.json", help="the zoo's report (default reports/zoo.json)")
    parser.add_argument("--html", **HTML_FLAG)
    args = parser.parse_args(argv)
    unknown = [name for name in args.only if name not in BY_NAME]
    if unknown:
        raise UsageError(f"--only: no scenario {', '.join(map(repr, unknown))}; the scenarios: {', '.join(BY_NAME)}")
    if args.steps < 1 or args.seeds < 0 or args.jobs < 1:
        raise UsageError("--steps and --jobs must be at least 1, --seeds at least 0")
    check_writable(args.json_out, "--json-out")
    if args.html:
        check_writable(args.html, "--html")
    from .harness.basics.interrupts import EXIT_CODES
    from .harness.basics.report import read_report
    from .zoo.run import passed, table, zoo

    def page(result: dict) -> None:
        if args.html:
            _write_page(args.html, "ckparity zoo", passed(result), f"{sum(s['detected'] for s in result['scenarios'])}"
                        f" of {len(result['scenarios'])} planted bugs detected", table(result))
    try:
        result = zoo(args.only, args.steps, args.seeds, Path(args.out_dir), args.json_out, args.jobs,
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    except KeyboardInterrupt as err:  # the report of what ran is written
        print(f"ckparity zoo: interrupted; what ran is in {args.json_out}", file=sys.stderr)
        if args.json_out != "-" and Path(args.json_out).is_file():
            page(read_report(args.json_out))
        return EXIT_CODES.get(getattr(err, "signum", signal.SIGINT), 130)
    page(result)
    print(table(result))
    return EXIT_PASS if passed(result) else EXIT_FAIL


COMMANDS = {"train": _train, "repro": _repro, "attribute": _attribute, "compare": _compare, "gate": _gate,
            "bench": _bench, "mutate": _mutate, "check": _check, "replay": _replay,
            "info": _info, "zoo": _zoo}


# the commands whose plugins load in a child process only (ckparity check's)
LOADED_IN_CHILD = {"check"}


def _load_plugins(command: str, argv: list[str]) -> list[str]:
    """Every command takes --plugin MODULE_OR_FILE.py (repeatable): loaded here
    (unless the command loads them in its child: LOADED_IN_CHILD), and passed
    on to every process the command starts (CKP_PLUGINS), with the plugins
    CKP_PLUGINS and installed packages' entry points name. Returns the other
    arguments."""
    from .harness.basics.config import UsageError

    specs, rest, k = [], [], 0
    while k < len(argv):
        if argv[k] == "--plugin" or argv[k].startswith("--plugin="):
            value = argv[k].partition("=")[2] if "=" in argv[k] else (argv[k + 1] if k + 1 < len(argv) else "")
            if not value:
                raise UsageError("--plugin needs a module name or a .py file")
            specs.append(value)
            k += 1 if "=" in argv[k] else 2
            continue
        rest.append(argv[k])
        k += 1
    try:
        if command not in LOADED_IN_CHILD:  # check's child loads them: a crash there is its verdict
            kernels.probe_plugins(specs)
        kernels.use_plugins(specs, load=command not in LOADED_IN_CHILD)
        if command not in LOADED_IN_CHILD:
            kernels.load_configured()
    except (ValueError, TypeError) as err:
        raise UsageError(str(err)) from None
    return rest


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return EXIT_USAGE if not argv or argv[0] not in ("-h", "--help") else EXIT_PASS
    from .harness.basics.config import UsageError
    from .harness.basics.report import ReportNotWritten

    try:
        return COMMANDS[argv[0]](_load_plugins(argv[0], argv[1:]))
    except UsageError as err:
        print(f"ckparity {argv[0]}: {err}", file=sys.stderr)
        return EXIT_USAGE
    except ReportNotWritten as err:
        print(f"ckparity {argv[0]}: {err}", file=sys.stderr)
        return EXIT_NOT_RECORDED
    except SystemExit as exit_:  # argparse: --help is 0, a bad flag is 2
        return int(exit_.code or 0)


if __name__ == "__main__":
    sys.exit(main())
