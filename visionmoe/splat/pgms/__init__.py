"""The .pgms format, one module per part, each encode rule beside its decode rule (the browser
decoder in ``web/src/`` mirrors it):

    bitstream.py       the container: preamble, checksummed sections, HEAD, tables, level streams
    coders.py          the stream coders (raw, zstd, lzma, rANS) and their byte-plane helpers
    rans.py            the rANS coder of format 4+ (numpy, or the compiled loops of ``visionmoe.ops.rans``)
    quantize.py        quantise and dequantise rules per format version (grids, palettes, frames)
    _frames.py         the parent frames positions and shapes are coded in
    prototypes.py      nearest prototype and the scale-rotation features a shape codebook stores
    file_transform.py  section XFRM: the coded frame back to the scene's
    decode.py          .pgms bytes (or a prefix of levels) -> GaussianScene, with its memory budget; ``info``

The encoder (``visionmoe.splat.encoder``) writes it; nothing here imports the encoder.
"""
