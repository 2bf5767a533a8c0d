"""What ckparity's Python autograd node costs on a tiny loss, against a C++ one: the same C call
(ckp_cross_entropy, the default variant, loss and dlogits in one pass) wrapped in a
torch::autograd::Function built with torch.utils.cpp_extension, timed beside
ckparity.cross_entropy and F.cross_entropy at N=8, V=256 (the bench's tiny row), forward and
backward, the three in turn:

    python scripts/cpp_node_floor.py [--repeats 21] [--json-out reports/bench/cpp_node_floor.json]

A measurement, not a path ckparity ships (it is one C library driven through cffi): it says how
much of the tiny rows' gap to torch's eager loss a C++ node would close. The C++ backward returns
the forward's gradient as is (an upstream gradient of 1, the bench's), the least work a node can do.
Needs a C++ compiler and ninja (the venv has ninja); the build goes to a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

import ckparity
from ckparity import cpu
from ckparity.bench import autograd_floor_us, interleaved_samples_ms
from ckparity.harness.basics.report import check_writable, write_json
from ckparity.kernels.benching import fwd_bwd

NODE = r'''
#include <torch/extension.h>
extern "C" {
#include "ckparity.h"
}
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct CrossEntropy : public torch::autograd::Function<CrossEntropy> {
    static torch::Tensor forward(AutogradContext *ctx, torch::Tensor logits, torch::Tensor target) {
        auto loss = torch::empty({}, logits.options());
        auto dlogits = torch::empty_like(logits);
        ckp_cross_entropy_options options;
        ckp_cross_entropy_options_init(&options);
        TORCH_CHECK(ckp_cross_entropy(logits.data_ptr<float>(), target.data_ptr<int64_t>(), nullptr,
                                      logits.size(0), logits.size(1), &options, loss.data_ptr<float>(),
                                      dlogits.data_ptr<float>()) == CKP_OK, ckp_last_error());
        ctx->save_for_backward({dlogits});
        return loss;
    }
    static variable_list backward(AutogradContext *ctx, variable_list grad) {
        return {ctx->get_saved_variables()[0], torch::Tensor()};
    }
};

torch::Tensor cross_entropy(torch::Tensor logits, torch::Tensor target) {
    return CrossEntropy::apply(logits, target);
}
'''


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--json-out", default="-")
    args = parser.parse_args(argv)
    check_writable(args.json_out, "--json-out")
    library = os.path.dirname(ckparity.__file__)
    include = Path(__file__).resolve().parent.parent / "csrc" / "include"
    with tempfile.TemporaryDirectory(prefix="ckparity-cpp-node-") as build:
        node = load_inline("ckparity_cpp_node", cpp_sources=[NODE], functions=["cross_entropy"],
                           extra_include_paths=[str(include)], build_directory=build,
                           extra_ldflags=[f"-L{library}", "-lckparity", f"-Wl,-rpath,{library}"])
    x = torch.randn(8, 256, requires_grad=True)
    t = torch.randint(0, 256, (8,))
    assert torch.equal(node.cross_entropy(x, t), ckparity.cross_entropy(x, t)), "not the same C call"
    sides = {"torch": fwd_bwd(F.cross_entropy, x, t), "ckparity": fwd_bwd(ckparity.cross_entropy, x, t),
             "cpp_node": fwd_bwd(node.cross_entropy, x, t)}
    samples = interleaved_samples_ms(list(sides.values()), args.repeats)
    us = {name: 1e3 * statistics.median(s) for name, s in zip(sides, samples)}
    result = {"schema": "ckparity.cpp_node_floor/1", "shape": [8, 256], "capability": cpu.capability(),
              "threads": ckparity.get_num_threads(), "torch": torch.__version__, "repeats": args.repeats,
              "us": us, "autograd_floor_us": autograd_floor_us(args.repeats),
              "speedup": {name: us["torch"] / us[name] for name in ("ckparity", "cpp_node")}}
    print(f"torch {us['torch']:.1f} us, ckparity {us['ckparity']:.1f} us ({result['speedup']['ckparity']:.2f}x), "
          f"C++ node {us['cpp_node']:.1f} us ({result['speedup']['cpp_node']:.2f}x)")
    write_json(args.json_out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
