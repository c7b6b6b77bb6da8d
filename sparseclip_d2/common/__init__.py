"""Layer 0 of sparseclip_d2: helpers on the standard library alone, importable by every
layer: the bounded in-memory cache (:mod:`.cache`), atomic file writes (:mod:`.io`), a run's
``progress.json`` file (:mod:`.progress_file`) and quieting repeated third-party log notices (:mod:`.logs`) and the refusal of keys set while
their switch is off (:mod:`.keys`)."""
