"""Shared test support: imported as ``tests.support.<module>`` (the repository root is on
``sys.path`` through the root ``conftest.py``)."""
