"""The local critical batch size study: the branches read (`reading`), each checkpoint decided
(`decision`) and its row of fits.json (`checkpoint_rows`), every base run analysed and fitted
(`local_cbs`), its report (`report`) and `python analysis/local_cbs.py` (`cli`)."""
