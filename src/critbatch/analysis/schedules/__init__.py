"""The batch-schedule study: schedules against fixed batches (`schedules`) and
`python analysis/schedules.py` (`cli`)."""
