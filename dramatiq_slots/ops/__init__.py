"""Operator tools: the ``dramatiq-slots`` command and the ``Inspector`` behind it."""
