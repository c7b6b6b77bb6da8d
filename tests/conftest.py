"""Shared pytest fixtures: small open_clip models with random weights (no network)."""
import os

import pytest

os.environ.setdefault("SPARSECLIP_TEXT_CACHE", "off")
