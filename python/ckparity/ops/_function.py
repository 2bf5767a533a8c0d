"""What every ckparity autograd Function shares: first-order gradients only,
and never silently.

A C backward is not differentiable by autograd. torch's own
``once_differentiable`` marks the gradients it returns so that a second
backward through them raises, but only when the incoming gradient itself
requires grad: for ``torch.autograd.grad(loss, x, create_graph=True)`` it
does not, and the gradient comes back with no graph at all, so a gradient
penalty silently loses its second-order term. ``first_order_only`` marks
the gradients whenever a graph is being built (create_graph=True): using
them in a second backward raises; using them as values is fine.

The mark is a node that raises when the engine runs it, and the engine runs
only nodes on a path to what is differentiated: a mark whose only inputs are
the detached gradients is off every path to the op's input x, so
``torch.autograd.grad(s, x, allow_unused=True)`` skipped it and returned None
where torch returns a second-order gradient. The saved tensors that require
grad (the op's differentiable inputs: x, weight, the logits) are therefore
inputs of the mark too, which puts it on the path from the gradient to them.
(rope saves only cos and sin: its gradient does not depend on x, whose
second-order gradient is then None in torch as well.)"""

from __future__ import annotations

import functools

import torch

_MESSAGE = (b"ckparity's kernels are differentiable once: this gradient came from a C backward under "
            b"create_graph=True and has no second derivative (compute it with torch's own ops instead)")


def first_order_only(backward):
    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if not torch.is_grad_enabled():  # a plain backward: nothing will differentiate these
            return backward(ctx, *grads)
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        single = not isinstance(outputs, tuple)
        outputs = (outputs,) if single else outputs
        marked = [o.detach().requires_grad_(True) if isinstance(o, torch.Tensor) else o for o in outputs]
        tensors = [o for o in marked if isinstance(o, torch.Tensor)]
        if not tensors:
            return outputs[0] if single else outputs
        anchors = [t for t in ctx.saved_tensors if isinstance(t, torch.Tensor) and t.requires_grad]
        # DelayedError: the node torch's once_differentiable uses; it raises when backward reaches it
        errored = torch._C._functions.DelayedError(_MESSAGE, len(tensors) + len(anchors))(*tensors, *anchors)
        errored = iter(errored if isinstance(errored, tuple) else (errored,))
        out = tuple(next(errored) if isinstance(o, torch.Tensor) else o for o in marked)
        return out[0] if single else out
    return wrapper


class CFunction(torch.autograd.Function):
    """An autograd Function around C kernels: subclasses define ``compute(*inputs)``
    (the forward), ``save(ctx, inputs, output)`` and ``backward``.

    Why not torch's setup_context style directly: for such Functions
    ``Function.apply`` binds the arguments through ``inspect.signature`` on
    every call (~35 us here, as long as the C kernel itself at small shapes).
    Joined into the classic ``forward(ctx, ...)`` it does not. What that
    style gives up — torch.func transforms — ckparity refuses anyway, with its
    own error, before a Function runs (``_tensors.require_cpu``)."""

    @classmethod
    def forward(cls, ctx, *inputs):
        output = cls.compute(*inputs)
        cls.save(ctx, inputs, output)
        return output
