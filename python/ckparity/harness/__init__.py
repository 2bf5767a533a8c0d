"""The long-horizon parity harness: a CK twin (C kernels) and a torch twin
trained side by side from identical weights, compared step by step."""
