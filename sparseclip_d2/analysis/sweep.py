"""The sweep's former single module, kept so that existing imports work: everything now lives
in :mod:`sparseclip_d2.sweeps` (one module per job; the user documentation is
``docs/sweeps.md``). New code imports from there."""
from ..sweeps import *  # noqa: F401,F403
from ..sweeps import __all__  # noqa: F401
