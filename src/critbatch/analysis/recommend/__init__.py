"""Recommendations: the batch and lr for a bigger run (`recommend`), the report's opening
summary per optimizer (`summary`), the recommendation report (`report`) and
`python analysis/recommend.py` (`cli`)."""
