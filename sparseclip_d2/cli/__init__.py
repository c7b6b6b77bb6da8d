"""Command-line programs of sparseclip_d2 (console scripts ``sparseclip-demo``, ...; the
``tools/`` scripts of a checkout call the same ``main`` functions)."""
