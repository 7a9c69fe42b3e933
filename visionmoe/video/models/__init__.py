"""The models shipped in the package (``assets/``, package data): the trained toy world
(:mod:`.toy_world`, a diffusers Wan 2.1 pipeline and its PILA adapter) and the tiny random Wan
of the tests (:mod:`.tiny`)."""
