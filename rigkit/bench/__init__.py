"""The bench's report: its schema checks, the plot and `make tune`'s choice (controller only)."""
