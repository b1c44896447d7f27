"""Human-readable renderings of runs and comparisons: Markdown summaries and the HTML report."""
