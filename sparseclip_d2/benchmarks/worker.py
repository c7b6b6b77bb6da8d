"""The benchmark's worker process: ``python <this file> SPEC_JSON``, started by
:class:`.harness.Worker`; it runs :func:`.harness.worker_main`.

Run by file path in the interpreter of its side, which for an upstream side may be another
environment without this package installed (``--<method>-python``): it puts the folder holding
this package first on ``sys.path``, in place of this file's own folder (so that no module here
shadows one of the upstream checkout's), then imports the harness. Importing this module does
nothing.
"""
import os
import sys

if __name__ == "__main__":
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from sparseclip_d2.benchmarks.harness import worker_main

    worker_main(sys.argv[1])
