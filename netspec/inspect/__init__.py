"""Looking at nets and runs: summaries and docs, timing, plots, drawings."""
