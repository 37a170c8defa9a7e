"""Model sources and data sources: load, validate, describe."""
