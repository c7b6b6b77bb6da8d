"""``python -m sparseclip_d2.app``: the ``sparseclip-app`` program."""
from .cli import cli_main

if __name__ == "__main__":
    cli_main()
