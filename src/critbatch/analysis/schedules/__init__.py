"""The batch-schedule study: schedules against fixed batches (`schedules`), its figures
(`plots`), its report and pipeline (`report`) and `python analysis/schedules.py` (`cli`)."""
