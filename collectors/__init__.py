"""Scrape, parse and hand rows to the warehouse."""

DEFAULT_INTERVAL = 5.0  # seconds between scrape rounds unless `serve --interval` says otherwise
