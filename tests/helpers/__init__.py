"""What test modules share: plain functions, classes and constants (pytest fixtures live in the conftest.py files).
A test module imports from here, never from another test module (tests/unit/test_test_layout.py)."""
