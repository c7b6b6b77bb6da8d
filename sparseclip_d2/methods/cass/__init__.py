"""CASS (MICV-yonsei/CASS): the spectral combination of CLIP's and the proxy's attention graphs on
the last block (:mod:`.encoder`) and the object-presence prompt adjustment (:mod:`.object_presence`,
the logit head in :mod:`.head`)."""
from .encoder import CASSEncoder, CASSSettings, cass_proxy_input, check_cass_settings, check_cass_spec
from .head import ObjectPresenceHead
from .object_presence import (OBJECT_PRESENCE_SECTION, ObjectPresence, object_presence_from_config,
                              object_presence_logits, text_clusters)
from . import keys  # noqa: F401  (registers the family and its config sections)
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)

#: the families this one is built on (it may name them; tests/project/test_source_rules.py)
BUILDS_ON = ("proxyclip",)

__all__ = ["CASSEncoder", "CASSSettings", "cass_proxy_input", "check_cass_settings", "check_cass_spec",
           "ObjectPresenceHead", "OBJECT_PRESENCE_SECTION", "ObjectPresence", "object_presence_from_config",
           "object_presence_logits", "text_clusters"]
