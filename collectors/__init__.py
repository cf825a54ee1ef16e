"""Scrape, parse and hand rows to the warehouse."""
