"""Paper tables as data: published numbers, table specs and sweep specs (``kdbench.results``)."""
