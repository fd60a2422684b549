"""Searching a kernel's config space: the driver's loop, the strategies that propose configs, the
coordination of the processes that share a study, and the finalists' re-timing. What measures a
config lives in omnitune.measure; the types a trial produces in omnitune.trial."""
