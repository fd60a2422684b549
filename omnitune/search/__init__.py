"""Searching a kernel's config space: the trial types, the measuring runner and the driver."""
