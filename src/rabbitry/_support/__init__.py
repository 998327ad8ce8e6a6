"""Helpers of every layer that import nothing of the package but the exceptions."""
