"""The browser viewer of .pgms files: :mod:`.server` serves the progressive viewer page (the
package data in ``site/``: ``web/viewer`` and the decoder in ``web/src``, put there by the build)
and takes headless-Chromium screenshots of it."""
