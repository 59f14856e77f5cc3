"""Apple's cut-cross-entropy (the paper's own kernels)."""
from suite.registry import all_of, needs_cuda, needs_module, register

_has = needs_module("cut_cross_entropy", "cut-cross-entropy")


def _cce(e, c, targets, softcap, ignore_index, **kw):
    from cut_cross_entropy import linear_cross_entropy

    return linear_cross_entropy(e, c, targets, ignore_index=ignore_index, softcap=softcap, **kw)


@register("apple_cce", summary="cut_cross_entropy, impl='cce', default gradient filter",
          requires=all_of(_has, needs_cuda), exact=False)
def apple_cce(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _cce(e, c, targets, softcap, ignore_index)


@register("apple_cce_nofilter", summary="cut_cross_entropy, impl='cce', filter_eps=None",
          requires=all_of(_has, needs_cuda))
def apple_cce_nofilter(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _cce(e, c, targets, softcap, ignore_index, filter_eps=None)


@register("apple_torch_compile", summary="cut_cross_entropy, impl='torch_compile'", requires=_has)
def apple_torch_compile(e, c, targets, *, bias=None, softcap=None, ignore_index=-100):
    return _cce(e, c, targets, softcap, ignore_index, impl="torch_compile")
