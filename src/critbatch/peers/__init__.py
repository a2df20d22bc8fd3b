"""Public sweeps: other studies' raw tables read, converted and analysed by critbatch.

`sources` finds each source's file (a local folder, or a download pinned by commit and
sha256), `steplaw` and `zhang` turn them into critbatch's answers, `report` writes them up.
"""
