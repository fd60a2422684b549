"""`omnitune verify`: the deployment checklist, run on the GPU that will serve the tables.

One module per part — compat (provenance against this machine), numerics (each entry's config
against the reference), speed (against its fallback and PyTorch, interleaved), memory (the
preset's largest shapes), soak (minutes of mixed production calls, CUDA graphs for decode steps)
— and verdict (the report, its JSON and its exit code). pipeline runs them in order; traffic
holds the public-op calls; tables reads the files; shrink makes the small problems --interpret
checks on the CPU; fix rewrites an entry slower than its fallback, and revalidate re-stamps a
table tuned on older kernel source whose entries still pass on its GPU.
"""
