"""The Dask executor."""
