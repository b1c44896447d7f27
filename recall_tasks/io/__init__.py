"""Storage layer: datasets in, result tables and caches out (fsspec, Parquet, Delta Lake, DuckDB); no Prefect."""
