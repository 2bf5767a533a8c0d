#!/usr/bin/env bash
# The nightly tier: the test command with the tests marked nightly (longer
# cases of properties CI checks faster; CKP_NIGHTLY=1), then the full tier of
# the parity gates. Extra arguments go to pytest, as for scripts/test.sh.
#
# The tests only this tier runs, each with the CI test that covers its
# property faster (tests/conftest.py refuses a nightly test not named here):
#   test_cross_entropy.py  test_grid_with_ignored_rows at 1000 x 50257
#                          (CI: the same grid up to 10**7 elements)
#   test_checkpoint.py     test_a_resumed_run_is_the_uninterrupted_run on the llama
#                          model (CI: the other models)
#                          test_a_ranked_run_resumes_to_the_uninterrupted_report,
#                          dp 2 (CI: tp 2; test_a_resume_takes_the_newest_step_every_rank_holds
#                          resumes a dp run)
#                          test_a_signalled_ranked_run_stops_every_rank_after_one_step_and_resumes
#                          (CI: SIGTERM and resume in one process)
#   test_harness.py        test_signal_writes_interrupted_report from outside, for
#                          SIGINT and SIGHUP (CI: SIGTERM from outside, all three in process)
#   test_ranks.py          test_a_killed_rank_ends_the_run_with_an_error_report
#                          (CI: test_a_rank_that_aborts_is_named_with_its_last_words)
#   test_mutate.py         test_one_mutant_end_to_end (CI: mutants built and run by the
#                          equivalence, SIGTERM and failed-build tests)
#                          test_the_probe_tells_every_mutant_but_the_equivalent_one_from_the_control
#                          (CI: the probe on chosen mutants)
#   test_plugins.py        test_attribute_jobs_load_the_plugin (CI: plugins reach gate
#                          and train children)
#                          test_gate_runs_on_a_users_backend with swiglu=fast_exp (CI: the
#                          exact swiglu passes those gates, the drifting AdamW fails its own)
#   test_capability.py     test_sweep_finds_another_capabilitys_arithmetic and
#                          test_sweep_is_bit_identical_at below the CPU's highest capability
#                          (CI: at the highest; test_clones runs every capability's C there)
#   test_gate_faults.py    test_distributed_parity_fails_on in bfloat16 (CI: float32's faults;
#                          test_gates_bf16 runs the bf16 gate)
#   test_crash_reports.py  test_attribute_survives_a_crashing_kernel_and_names_it at --jobs 2
#                          (CI: --jobs 1; train's own crash reports at every --jobs)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CKP_NIGHTLY=1 ./scripts/test.sh "$@"
.venv/bin/ckparity gate --tier full
.venv/bin/ckparity gate --tier full --dtype bfloat16
