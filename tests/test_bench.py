"""ckparity bench writes its JSON (no test asserts a time)."""

import json

import torch
import torch.nn.functional as F

import ckparity
from ckparity import bench
from ckparity.cli import main


def test_bench_json_has_every_field(tmp_path, monkeypatch, capsys):
    x = torch.randn(8, 256).requires_grad_(True)
    t = torch.randint(0, 256, (8,))

    def one_case():
        yield ("cross_entropy", "N=8,V=256", bench._fwd_bwd(ckparity.cross_entropy, x, t),
               bench._fwd_bwd(F.cross_entropy, x, t), 8 * 8 * 256)

    monkeypatch.setattr(bench, "cases", one_case)
    out = tmp_path / "bench.json"
    assert main(["bench", "--json-out", str(out), "--repeats", "2"]) == 0
    data = json.loads(out.read_text())
    assert data["copy_gbps"] > 0 and data["threads"] == ckparity.get_num_threads()
    (row,) = data["results"]
    for key in ("kernel", "shape", "ckparity_ms", "torch_ms", "speedup", "bandwidth_fraction"):
        assert key in row
    assert row["speedup"] == row["torch_ms"] / row["ckparity_ms"]
    assert "| cross_entropy | N=8,V=256 |" in capsys.readouterr().out
    assert main(["bench", "--repeats", "0"]) == 2
