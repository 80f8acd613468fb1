"""Helpers shared by the tests: imported by test files, never the other way round."""
