"""The kernel spine: one record per kernel, which every suite loops over.

A record (``record.Kernel``, in the spirit of torch's OpInfo) holds what the
layers above need to know of one kernel, and nothing of how they run:

- ``name``: the one key, used in every layer (``csrc/rms_norm.c``,
  ``ckp_rms_norm_*``, ``ckparity.rms_norm``, ``tests/test_rms_norm.py``);
  a variant is ``kernel.variant`` (``cross_entropy.ptref``);
- ``flag``, ``spellings``: the seed's flag that picks the CK twin's backend
  (``--ck-rmsnorm-backend``), and the other names a user may give the slot;
- ``backends``: the slot's live registry, name -> callable; ckparity's own
  (``c``, ``torch``, ...) and users' (``register_backend``, registry.py);
- ``contract``: what a user's backend must do to be registered;
- ``conformance``: ``ckparity check``'s cases (inputs, calls, bad inputs,
  options, torch's OpInfo samples);
- ``gate_cases``: the kernel_parity gate's fixed shapes, with their rule;
- ``claims``: what is bit-identical to torch, per dtype and capability, each
  with the sweep that shows it (ckparity.sweep, tests/test_capability.py);
  ``not_claimed``: what is not, and why;
- ``probe``: every C entry point of the kernel through a given build of the
  library (ckparity.builds: the single-ISA builds' test, mutate's
  equivalence probe); ``bench``: its rows in ``ckparity bench``.

The suites hold procedures only: check/, gates/, sweep.py, builds.py
(and so mutate's probe), bench.py, the harness's twins, ``ckparity info``
and the docs' table read the records.

Adding a kernel ``softcap``:
1. ``csrc/softcap.c`` and its entry points in ``csrc/include/ckparity.h``
   (the cffi declarations are read from the header), its line in
   ``meson.build``'s kernel_sources;
2. ``_bindings.softcap_*``: pointers, sizes, the status check;
3. ``ops/softcap.py``: the autograd op (and its export in ``ckparity``);
4. ``kernels/softcap.py``: its record, and its name in ``spine.KERNELS``;
5. ``tests/test_softcap.py``: what its record does not already make every
   suite check (tests/test_spine.py holds every record to the spine's
   rules: a flag, a contract its own backends pass, claims with sweeps;
   tests/test_capability.py runs the sweeps at every capability).
Only if the twins' models call it: the record's ``slot`` (the ``Ops`` field
``factory.ops_for`` fills from the records) and ``exercise`` (how a run that
does not call it is made to), its field in ``harness/twins/models.py``'s
``Ops`` and the model's call of it, its flag's field in
``harness/basics/config.py`` (and ``kernels_used``, where only some models call
it). A slot with torch's backend alone (``linear``: no C yet) is a record with
``backends={"torch": ...}``, its contract and check cases: 5 files, the test
included (tests/test_slots.py).
"""

from __future__ import annotations

from .contract import ContractError
from .record import CAPABILITIES, WIDTHS, BadInput, Claim, Conformance, GateCase, Kernel, Registration
from .registry import (carried, carried_together, child_env, deferred_contracts, load_carried, load_configured, load_plugin, probe_plugins, register,
                       register_backend, registered, resolve, slot, unknown_backend_message, use_plugins)
from .spine import FLAGS, HEAD_LOSS, KERNELS, SLOTS, backends, bit_identical, claim_key, claims, not_bit_identical

__all__ = ["KERNELS", "FLAGS", "SLOTS", "HEAD_LOSS", "Kernel", "Claim", "Conformance", "GateCase", "WIDTHS",
           "BadInput", "Registration", "claim_key", "deferred_contracts", "carried", "carried_together", "child_env", "load_carried", "CAPABILITIES", "ContractError", "backends", "bit_identical", "claims", "load_configured", "load_plugin",
           "not_bit_identical", "probe_plugins", "register", "register_backend", "registered", "resolve", "slot",
           "unknown_backend_message", "use_plugins"]
