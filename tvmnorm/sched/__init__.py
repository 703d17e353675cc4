"""How to compute: schedules for the PrimFuncs in tvmnorm.compute.

``default`` holds the general rule per target (the fallback), ``space`` the MetaSchedule design
space that tuning explores. Both build on ``rows``, the shared row-kernel schedule, so a tuned
record and the fallback differ only in their knob values.
"""
