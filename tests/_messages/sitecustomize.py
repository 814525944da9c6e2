"""Loaded by every Python process the test suite starts (``PYTHONPATH`` names this folder,
tests/conftest.py sets it): the error messages mpisdnn creates in that process are written,
when it exits, to the file ``$MPISDNN_TEST_MESSAGE_LOG`` names, so that the suite can check
every message a test provoked, in-process or in an ``mpiexec`` job (issue 42 item 12).
Imports only ``mpisdnn.errors`` (no numpy: the start-up signal tests time the imports)."""

import os

if os.environ.get("MPISDNN_TEST_MESSAGE_LOG"):
    try:
        from tests._messages.record import install  # noqa: F401 - when the repo is on the path
    except ImportError:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "_mpisdnn_test_record", os.path.join(os.path.dirname(__file__), "record.py")
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        install = module.install
    try:
        install(at_exit=True)
    except ImportError:  # mpisdnn itself is not importable here: nothing to record
        pass
