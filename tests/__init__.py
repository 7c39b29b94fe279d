"""simplace tests (a package, so shared helpers import as tests.<module>)."""
