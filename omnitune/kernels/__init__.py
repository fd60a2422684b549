"""Triton kernels, one module each: the @triton.jit code, a launcher, a PyTorch reference and
the module's SPEC (omnitune.spec.KernelSpec). Beside them, the helpers their public functions
share (the underscored modules) and `layers`, whole layers for production code built on them."""
