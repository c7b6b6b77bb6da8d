#!/usr/bin/env python
"""Which checkout's ``sparseclip_d2`` does this interpreter import? Run by scripts/setup.sh
with the venv's python (and no PYTHONPATH) before it trusts an existing venv:

    VENV/bin/python scripts/check_venv_binding.py CHECKOUT

Exit 0 when ``sparseclip_d2`` resolves to ``CHECKOUT/sparseclip_d2`` or is not installed
(setup installs it), 3 when it resolves to another folder (an editable install made by
another checkout: that checkout's code would run under this one's tools), with one
message naming both folders and the fixes. Uses ``importlib.util.find_spec`` only: the
package is located, not imported (no torch import, works on a half-built venv).
"""
import importlib.util
import os
import sys


def bound_package_dir():
    """The folder ``import sparseclip_d2`` would load, or None when it is not installed."""
    spec = importlib.util.find_spec("sparseclip_d2")
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(os.path.realpath(spec.origin))


def main(argv):
    if len(argv) != 1:
        print("usage: check_venv_binding.py CHECKOUT", file=sys.stderr)
        return 2
    checkout = os.path.realpath(argv[0])
    want = os.path.join(checkout, "sparseclip_d2")
    got = bound_package_dir()
    if got is None:
        print("sparseclip_d2 is not installed in this environment")
        return 0
    if got == want:
        print(f"sparseclip_d2 is this checkout's ({got})")
        return 0
    venv = sys.prefix
    print(
        f"the environment {venv} runs sparseclip_d2 from {got}, not from this checkout ({want}): "
        f"its editable install belongs to another checkout, so this checkout's tools would run that "
        f"checkout's code. Fix: give this checkout its own environment "
        f"(SPARSECLIP_VENV={os.path.join(checkout, '.venv')} bash {os.path.join(checkout, 'scripts', 'setup.sh')}), "
        f"or rebind this one to this checkout (SPARSECLIP_REBIND=1 SPARSECLIP_VENV={venv} bash "
        f"{os.path.join(checkout, 'scripts', 'setup.sh')}; the other checkout then needs its own), or run this "
        f"checkout's code with PYTHONPATH={checkout} (it comes before the editable install)",
        file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
