"""This checkout as a ``dg`` project: its code location is the components under ``defs/``."""
