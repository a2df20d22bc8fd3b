"""The local critical batch size study: estimates from branches (`local_cbs`), its report
(`report`) and `python analysis/local_cbs.py` (`cli`)."""
