"""The measuring side: the runners that put a config on the GPU (in process, in an isolated
worker process, or replayed from a recorded sweep) and the precompilation that fills Triton's
cache ahead of them. The search decides what to measure; this package only measures it."""
