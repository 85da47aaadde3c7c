"""The dramatiq-slots test suite (a package, so ``tests.support`` and ``tests.apps`` import by name)."""
