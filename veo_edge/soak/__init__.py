"""``veo-edge soak``: load (:mod:`.load`, :mod:`.targets`), record (:mod:`.store`, :mod:`.sampler`),
analyse (:mod:`.analyse`, :mod:`.fragmentation`) and report (:mod:`.report`); :mod:`.run` ties them."""
