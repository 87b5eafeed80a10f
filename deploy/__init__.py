"""The ``tailgate`` CLI, the local launcher and the configuration loader."""
