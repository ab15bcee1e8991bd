"""The repository's own rules: the folders' architecture, citations, runnable modules, the installer."""
