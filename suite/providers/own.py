"""This project's own Triton CCE kernel (own_kernel/)."""
from suite.registry import needs_triton_device, register


def _call(e, c, targets, bias, softcap, ignore_index, filter_eps):
    from own_kernel import linear_cross_entropy

    return linear_cross_entropy(e, c, targets, bias=bias, softcap=softcap,
                                ignore_index=ignore_index, filter_eps=filter_eps)


@register("own", summary="own Triton CCE, exact gradients", features=("bias", "softcap"),
          requires=needs_triton_device)
def own(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _call(e, c, targets, bias, softcap, ignore_index, None)


@register("own_filter", summary="own Triton CCE, gradient filter (filter_eps='auto')",
          features=("bias", "softcap"), requires=needs_triton_device, exact=False)
def own_filter(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _call(e, c, targets, bias, softcap, ignore_index, "auto")
