"""The ``recall-bench`` command line: the Typer app, output formats, the local Prefect server it manages."""
