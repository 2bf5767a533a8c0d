"""What every ckparity autograd Function shares.

The Functions are written in torch.func's style (forward without ctx, a
separate setup_context), so torch.func.grad, jacrev and friends run through
them. vmap cannot: a C kernel reads a tensor's memory, and a batched tensor
under vmap has none of its own. Each Function's vmap rule therefore raises
an error that says so, instead of torch's generic one."""

from __future__ import annotations

from ..errors import CkparityError


class VmapUnsupported(CkparityError, NotImplementedError):
    """torch.func.vmap over a ckparity op."""


def refuse_vmap(op: str):
    def vmap(info, in_dims, *args):
        raise VmapUnsupported(
            f"ckparity.{op} does not support torch.func.vmap: its C kernel reads the tensors' memory "
            f"directly; call it on the batched tensor (it takes any number of leading dimensions) or "
            f"loop over the batch")
    return vmap
