"""Triton kernels, one module each: the @triton.jit code, a launcher, a PyTorch reference and
the module's SPEC (omnitune.spec.KernelSpec)."""
