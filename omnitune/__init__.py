"""omnitune: autotune and profile Triton kernels for multimodal LLM inference."""

__version__ = "0.1.0"
__all__ = ["__version__"]
