"""Measuring: CUDA-event timing, device facts, and the figures derived from a kernel's model."""
